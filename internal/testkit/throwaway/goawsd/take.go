package main

import (
	"encoding/json"
	"net/http"

	"github.com/Admiral-Piett/goaws/app"
)

// TakePath answers GET TakePath?queue=NAME with every message of the
// queue that no receive holds, in queue order, as JSON (Taken), and
// removes them: a test's read-back of a whole run in one request, where
// SQS's ReceiveMessage and DeleteMessage take two requests a message
// (goaws returns one message of a FIFO group per receive) and a
// 10-minute outage's 240,000 messages took most of an hour.
const TakePath = "/goawsd/take"

// Taken is one message as TakePath returns it.
type Taken struct {
	Body       string            `json:"body"`
	Attributes map[string]string `json:"attributes"` // string values by name
	GroupID    string            `json:"group_id,omitempty"`
}

func take(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("queue")
	app.SyncQueues.Lock()
	q, ok := app.SyncQueues.Queues[name]
	var out []Taken
	if ok {
		kept := q.Messages[:0]
		for _, m := range q.Messages {
			if m.ReceiptHandle != "" {
				kept = append(kept, m)
				continue
			}
			t := Taken{Body: string(m.MessageBody), Attributes: map[string]string{}, GroupID: m.GroupID}
			for k, v := range m.MessageAttributes {
				t.Attributes[k] = v.Value
			}
			out = append(out, t)
		}
		q.Messages = kept
	}
	app.SyncQueues.Unlock()
	if !ok {
		http.Error(w, "no queue "+name, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
