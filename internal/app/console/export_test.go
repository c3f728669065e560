package console

import (
	"io"
	"net/http/httptest"
	"testing"
)

// RenderForTest renders the page at path.
func RenderForTest(t *testing.T, c *Console, path string) string {
	t.Helper()
	w := httptest.NewRecorder()
	c.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(w.Result().Body)
	if w.Code != 200 {
		t.Fatalf("%s: %d %s", path, w.Code, b)
	}
	return string(b)
}

// SeriesForTest returns a topic's pending counts, oldest first.
func SeriesForTest(s *Sampler, topic string) []int64 {
	series, _ := s.series()
	var out []int64
	for _, p := range series[topic] {
		out = append(out, p.Pending)
	}
	return out
}
