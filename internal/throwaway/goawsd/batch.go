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

// withBatches answers PublishBatch (see publishBatch), and
// SendMessageBatch by running goaws' own SendMessage
// once per entry, in entry order, and assembling the batch answer from
// their answers: goaws v0.4.5 has SendMessageBatch but drops each entry's
// message attributes, which the SQS sink depends on. Every entry then goes
// through the same checks as a single SendMessage (queue, FIFO group and
// deduplication), and an entry goaws refuses becomes a failed entry with
// goaws' error code, as SQS reports per-entry failures.
func withBatches(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		switch r.Form.Get("Action") {
		case "SendMessageBatch":
		case "PublishBatch":
			publishBatch(next, w, r)
			return
		default:
			next.ServeHTTP(w, r)
			return
		}
		const prefix = "SendMessageBatchRequestEntry."
		entries := map[int]url.Values{}
		for k, v := range r.Form {
			rest, ok := strings.CutPrefix(k, prefix)
			if !ok {
				continue
			}
			n, field, ok := strings.Cut(rest, ".")
			i, err := strconv.Atoi(n)
			if !ok || err != nil {
				continue
			}
			if entries[i] == nil {
				entries[i] = url.Values{}
			}
			entries[i][field] = v
		}
		if len(entries) == 0 || len(entries) > 10 {
			next.ServeHTTP(w, r) // goaws' own answer: empty or too many entries
			return
		}
		order := make([]int, 0, len(entries))
		for i := range entries {
			order = append(order, i)
		}
		sort.Ints(order)
		var res app.SendMessageBatchResult
		for _, i := range order {
			e := entries[i]
			id := e.Get("Id")
			e.Del("Id")
			e.Set("Action", "SendMessage")
			e.Set("QueueUrl", r.Form.Get("QueueUrl"))
			e.Set("Version", r.Form.Get("Version"))
			req := httptest.NewRequest(http.MethodPost, r.URL.String(), strings.NewReader(e.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				var er app.ErrorResponse
				_ = xml.Unmarshal(rec.Body.Bytes(), &er)
				res.Error = append(res.Error, app.BatchResultErrorEntry{Id: id, Code: er.Result.Code,
					Message: er.Result.Message, SenderFault: rec.Code < 500})
				continue
			}
			var ok app.SendMessageResponse
			_ = xml.Unmarshal(rec.Body.Bytes(), &ok)
			res.Entry = append(res.Entry, app.SendMessageBatchResultEntry{Id: id, MessageId: ok.Result.MessageId,
				MD5OfMessageBody: ok.Result.MD5OfMessageBody, MD5OfMessageAttributes: ok.Result.MD5OfMessageAttributes,
				SequenceNumber: ok.Result.SequenceNumber})
		}
		w.Header().Set("Content-Type", "application/xml")
		_ = xml.NewEncoder(w).Encode(app.SendMessageBatchResponse{Xmlns: "http://queue.amazonaws.com/doc/2012-11-05/",
			Result: res, Metadata: app.ResponseMetadata{RequestId: "00000000-0000-0000-0000-000000000000"}})
	})
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
	const prefix = "PublishBatchRequestEntries.member."
	entries := map[int]url.Values{}
	for k, v := range r.Form {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		n, field, ok := strings.Cut(rest, ".")
		i, err := strconv.Atoi(n)
		if !ok || err != nil {
			continue
		}
		if entries[i] == nil {
			entries[i] = url.Values{}
		}
		entries[i][field] = v
	}
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
	order := make([]int, 0, len(entries))
	for i := range entries {
		order = append(order, i)
	}
	sort.Ints(order)
	for _, i := range order {
		e := entries[i]
		id := e.Get("Id")
		e.Del("Id")
		e.Set("Action", "Publish")
		e.Set("TopicArn", r.Form.Get("TopicArn"))
		e.Set("Version", r.Form.Get("Version"))
		req := httptest.NewRequest(http.MethodPost, r.URL.String(), strings.NewReader(e.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			var er app.ErrorResponse
			_ = xml.Unmarshal(rec.Body.Bytes(), &er)
			res.Result.Failed = append(res.Result.Failed, publishBatchFail{ID: id, Code: er.Result.Code,
				Message: er.Result.Message, SenderFault: rec.Code < 500})
			continue
		}
		var ok app.PublishResponse
		_ = xml.Unmarshal(rec.Body.Bytes(), &ok)
		res.Result.Successful = append(res.Result.Successful, publishBatchOK{ID: id, MessageID: ok.Result.MessageId})
	}
	res.Metadata.RequestId = "00000000-0000-0000-0000-000000000000"
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(res)
}
