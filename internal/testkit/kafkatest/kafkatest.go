// Package kafkatest holds what the Kafka tests share about franz-go's
// in-process broker (kfake): the faults they inject, a produce request
// refused with an error code (Refuse) and a produce answer lost after
// the append (AnswerLoss).
package kafkatest

import "github.com/twmb/franz-go/pkg/kmsg"

// Refuse answers a produce request with code on every partition it
// names, appending nothing: the broker-side fault that a kfake ControlKey
// handler returns.
func Refuse(kreq kmsg.Request, code int16) kmsg.Response {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
