package throwaway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// visibility is goawsd's visibility timeout for every queue
// (goawsd.VisibilitySeconds) plus its one-second sweep: how long a
// message stays hidden after a receive whose answer never arrived.
const visibility = 6 * time.Second

// Take receives at most n messages of the queue at queueURL, one request
// per message, deleting each before the next; it stops early when the
// queue has nothing visible. One at a time because goaws v0.4.5 marks a
// message of a locked FIFO group as received without returning it.
//
// goaws sometimes loses the answer of a request ("use of closed network
// connection" reading it, about once in ten runs of a package). A
// receive that fails that way may have hidden its message for the
// visibility timeout, so Take retries it and, until that timeout has
// passed, does not take an empty queue for empty; a failed delete is
// retried with the same receipt handle. Requests are not cancelled early:
// a receive cut short after the server answered would hide its message
// the same way. Take gives up after a minute without a message taken (a
// server that is not coming back: a bound, not a measure).
func (g *GoAWS) Take(client *sqs.Client, queueURL string, n int) ([]types.Message, error) {
	const stall = time.Minute
	var out []types.Message
	var lost error
	var hiddenUntil time.Time
	deadline := time.Now().Add(stall)
	call := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		return f(ctx)
	}
	for len(out) < n {
		if time.Now().After(deadline) {
			return out, fmt.Errorf("receive: nothing taken for %s (last lost answer: %v)", stall, lost)
		}
		var res *sqs.ReceiveMessageOutput
		err := call(func(ctx context.Context) (err error) {
			res, err = client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL),
				MaxNumberOfMessages: 1, MessageAttributeNames: []string{"All"}})
			return err
		})
		if err != nil || len(res.Messages) == 0 && time.Now().Before(hiddenUntil) {
			if err != nil {
				lost, hiddenUntil = err, time.Now().Add(visibility)
			}
			// Polling the server for the message a lost answer hid.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if len(res.Messages) == 0 {
			return out, nil
		}
		m := res.Messages[0]
		for {
			err := call(func(ctx context.Context) error {
				_, err := client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle})
				return err
			})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return out, fmt.Errorf("delete: %w", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		out = append(out, m)
		deadline = time.Now().Add(stall)
	}
	return out, nil
}

// Taken is a message TakeAll returned: its body, its message attributes'
// string values by name, and its FIFO group.
type Taken struct {
	Body       string            `json:"body"`
	Attributes map[string]string `json:"attributes"`
	GroupID    string            `json:"group_id,omitempty"`
}

// TakeAll takes every message of queue name that no receive holds, in
// queue order, in one request to goawsd (its /goawsd/take, not an SQS
// call): the read-back of a fault test's whole run, where Take costs two
// requests a message. The messages leave the queue as the server
// answers, so an answer lost on the way cannot be taken again: its error
// fails the test rather than hiding messages.
func (g *GoAWS) TakeAll(name string) ([]Taken, error) {
	res, err := http.Get(g.Endpoint() + "/goawsd/take?" + url.Values{"queue": {name}}.Encode())
	if err != nil {
		return nil, fmt.Errorf("goawsd take %s: %w", name, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("goawsd take %s: %s", name, res.Status)
	}
	var out []Taken
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("goawsd take %s: %w", name, err)
	}
	return out, nil
}
