package main

import (
	"time"

	"github.com/Admiral-Piett/goaws/app"
)

// VisibilitySeconds is every queue's visibility timeout: a message
// received and not deleted (a read-back whose answer was lost on the way)
// is visible again this many seconds later, give or take the one-second
// sweep. throwaway.GoAWS.Take relies on it.
const VisibilitySeconds = 5

// sweep runs every interval until quit closes: it forgets the
// deduplication ids older than goaws' deduplication period and makes
// visible again the received messages whose visibility timeout passed
// (unlocking their FIFO group, counting a receive, and moving a message
// past its queue's MaxReceiveCount to the dead-letter queue).
//
// It replaces goaws' own gosqs.PeriodicTasks, which does the same under
// the server's one lock but walks every deduplication id once for every
// message of the queue: with a few thousand messages held in a FIFO queue
// (a fault test's backlog after an outage) one sweep held the lock for
// seconds, and every SendMessage waited behind it past the sink's publish
// timeout. Here each sweep is linear in messages plus ids.
func sweep(interval time.Duration, quit <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		app.SyncQueues.Lock()
		now := time.Now()
		for _, q := range app.SyncQueues.Queues {
			for id, at := range q.Duplicates {
				if now.After(at.Add(app.DeduplicationPeriod)) {
					delete(q.Duplicates, id)
				}
			}
			kept := q.Messages[:0]
			for _, m := range q.Messages {
				if m.ReceiptHandle != "" && m.VisibilityTimeout.Before(now) {
					q.UnlockGroup(m.GroupID)
					m.ReceiptHandle = ""
					m.ReceiptTime = now.UTC()
					m.Retry++
					if q.MaxReceiveCount > 0 && q.DeadLetterQueue != nil && m.Retry > q.MaxReceiveCount {
						q.DeadLetterQueue.Messages = append(q.DeadLetterQueue.Messages, m)
						continue
					}
				}
				kept = append(kept, m)
			}
			q.Messages = kept
		}
		app.SyncQueues.Unlock()
	}
}
