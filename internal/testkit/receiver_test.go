package testkit

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

func post(t *testing.T, url, body string) (int, error) {
	t.Helper()
	resp, err := http.Post(url, "text/plain", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func TestReceiverAnswersAsTheHandlerSays(t *testing.T) {
	rc := NewTestReceiver(t, func(r *Request) (int, string) {
		if string(r.Body) == "bad" {
			return http.StatusUnprocessableEntity, "no"
		}
		return http.StatusAccepted, ""
	})
	for body, want := range map[string]int{"ok": http.StatusAccepted, "bad": http.StatusUnprocessableEntity} {
		code, err := post(t, rc.URL(), body)
		if err != nil || code != want {
			t.Fatalf("POST %q: %d, %v; want %d", body, code, err, want)
		}
	}
	if rc.Requests() != 2 || rc.Accepted() != 1 {
		t.Fatalf("requests %d, accepted %d; want 2, 1", rc.Requests(), rc.Accepted())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if !rc.WaitAccepted(ctx, 1) {
		t.Fatal("WaitAccepted(1) after one accepted request")
	}
}

func TestReceiverStopsAndStartsOnTheSamePort(t *testing.T) {
	rc := NewTestReceiver(t, nil)
	url := rc.URL()
	rc.Stop()
	if _, err := post(t, url, "x"); err == nil {
		t.Fatal("a stopped receiver answered")
	}
	if err := rc.Start(); err != nil {
		t.Fatal(err)
	}
	if rc.URL() != url {
		t.Fatalf("started again on %s, was %s", rc.URL(), url)
	}
	done := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- rc.WaitAccepted(ctx, 1)
	}()
	if code, err := post(t, url, "x"); err != nil || code != http.StatusNoContent {
		t.Fatalf("POST after Start: %d, %v", code, err)
	}
	if !<-done {
		t.Fatal("WaitAccepted did not see the request")
	}
}
