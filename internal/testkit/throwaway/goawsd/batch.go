package main

import (
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/Admiral-Piett/goaws/app"
)

// withBatches answers TakePath (take.go), PublishBatch (see publishBatch), and
// SendMessageBatch by running goaws' own SendMessage
// once per entry, in entry order, and assembling the batch answer from
// their answers: goaws v0.4.5 has SendMessageBatch but drops each entry's
// message attributes, which the SQS sink depends on. Every entry then goes
// through the same checks as a single SendMessage (queue, FIFO group and
// deduplication), and an entry goaws refuses becomes a failed entry with
// goaws' error code, as SQS reports per-entry failures.
func withBatches(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == TakePath {
			take(w, r)
			return
		}
		if err := r.ParseForm(); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		switch r.Form.Get("Action") {
		case "SendMessageBatch":
			sendMessageBatch(next, w, r)
		case "PublishBatch":
			publishBatch(next, w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// sendMessageBatch answers SendMessageBatch with one SendMessage an entry.
func sendMessageBatch(next http.Handler, w http.ResponseWriter, r *http.Request) {
	entries := batchEntries(r.Form, "SendMessageBatchRequestEntry.")
	if len(entries) == 0 || len(entries) > 10 {
		next.ServeHTTP(w, r) // goaws' own answer: empty or too many entries
		return
	}
	var res app.SendMessageBatchResult
	for _, a := range runEach(next, r, entries, "SendMessage", "QueueUrl") {
		if a.failed != nil {
			res.Error = append(res.Error, app.BatchResultErrorEntry{Id: a.id, Code: a.failed.Result.Code,
				Message: a.failed.Result.Message, SenderFault: a.sender})
			continue
		}
		var ok app.SendMessageResponse
		_ = xml.Unmarshal(a.body, &ok)
		res.Entry = append(res.Entry, app.SendMessageBatchResultEntry{Id: a.id, MessageId: ok.Result.MessageId,
			MD5OfMessageBody: ok.Result.MD5OfMessageBody, MD5OfMessageAttributes: ok.Result.MD5OfMessageAttributes,
			SequenceNumber: ok.Result.SequenceNumber})
	}
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(app.SendMessageBatchResponse{Xmlns: "http://queue.amazonaws.com/doc/2012-11-05/",
		Result: res, Metadata: app.ResponseMetadata{RequestId: "00000000-0000-0000-0000-000000000000"}})
}

// publishBatchResponse is SNS's answer to PublishBatch.
type publishBatchResponse struct {
	XMLName xml.Name `xml:"PublishBatchResponse"`
	Xmlns   string   `xml:"xmlns,attr"`
	Result  struct {
		Successful []publishBatchOK   `xml:"Successful>member"`
		Failed     []publishBatchFail `xml:"Failed>member"`
	} `xml:"PublishBatchResult"`
	Metadata app.ResponseMetadata `xml:"ResponseMetadata"`
}

type publishBatchOK struct {
	ID        string `xml:"Id"`
	MessageID string `xml:"MessageId"`
}

type publishBatchFail struct {
	ID          string `xml:"Id"`
	Code        string `xml:"Code"`
	Message     string `xml:"Message"`
	SenderFault bool   `xml:"SenderFault"`
}

// publishBatch answers PublishBatch, which goaws v0.4.5 does not know, by
// running goaws' Publish once per entry, in entry order: each entry is
// checked and delivered to the topic's subscriptions as a Publish is, and
// an entry goaws refuses becomes a failed entry with goaws' error code.
func publishBatch(next http.Handler, w http.ResponseWriter, r *http.Request) {
	entries := batchEntries(r.Form, "PublishBatchRequestEntries.member.")
	var res publishBatchResponse
	res.Xmlns = "http://sns.amazonaws.com/doc/2010-03-31/"
	if len(entries) == 0 || len(entries) > 10 {
		w.WriteHeader(http.StatusBadRequest)
		code := "EmptyBatchRequest"
		if len(entries) > 10 {
			code = "TooManyEntriesInBatchRequest"
		}
		_ = xml.NewEncoder(w).Encode(app.ErrorResponse{Result: app.ErrorResult{Type: "Sender", Code: code, Message: code}})
		return
	}
	for _, a := range runEach(next, r, entries, "Publish", "TopicArn") {
		if a.failed != nil {
			res.Result.Failed = append(res.Result.Failed, publishBatchFail{ID: a.id, Code: a.failed.Result.Code,
				Message: a.failed.Result.Message, SenderFault: a.sender})
			continue
		}
		var ok app.PublishResponse
		_ = xml.Unmarshal(a.body, &ok)
		res.Result.Successful = append(res.Result.Successful, publishBatchOK{ID: a.id, MessageID: ok.Result.MessageId})
	}
	res.Metadata.RequestId = "00000000-0000-0000-0000-000000000000"
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(res)
}

// batchEntries are the entries of a batch request, in entry order: the
// form's fields prefix.N.Field, as url.Values of Field per N.
func batchEntries(form url.Values, prefix string) []url.Values {
	byN := map[int]url.Values{}
	for k, v := range form {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		n, field, ok := strings.Cut(rest, ".")
		i, err := strconv.Atoi(n)
		if !ok || err != nil {
			continue
		}
		if byN[i] == nil {
			byN[i] = url.Values{}
		}
		byN[i][field] = v
	}
	order := make([]int, 0, len(byN))
	for i := range byN {
		order = append(order, i)
	}
	sort.Ints(order)
	entries := make([]url.Values, len(order))
	for k, i := range order {
		entries[k] = byN[i]
	}
	return entries
}

// answer is goaws' answer to one entry of a batch: its body, or the
// error it refused the entry with (sender: a client error).
type answer struct {
	id     string
	body   []byte
	failed *app.ErrorResponse
	sender bool
}

// runEach runs action (with the batch request's target field) once per
// entry, in order, through goaws' own handler.
func runEach(next http.Handler, r *http.Request, entries []url.Values, action, target string) []answer {
	out := make([]answer, 0, len(entries))
	for _, e := range entries {
		id := e.Get("Id")
		e.Del("Id")
		e.Set("Action", action)
		e.Set(target, r.Form.Get(target))
		e.Set("Version", r.Form.Get("Version"))
		req := httptest.NewRequest(http.MethodPost, r.URL.String(), strings.NewReader(e.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		a := answer{id: id, body: rec.Body.Bytes()}
		if rec.Code != http.StatusOK {
			a.failed = &app.ErrorResponse{}
			_ = xml.Unmarshal(a.body, a.failed)
			a.sender = rec.Code < 500
		}
		out = append(out, a)
	}
	return out
}
