package kinesissink

import (
	"errors"
	"slices"
	"time"

	"github.com/aws/smithy-go"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
)

// permanentCodes are the Kinesis error codes that say a record, or its
// stream, can never be accepted: the message is dead-lettered at once.
// Every other code is retried, bounded by max attempts: throughput and
// rate limits, internal failures, and the trouble an operator can fix
// without touching the message (credentials and permissions, the
// stream's KMS key disabled, missing or not allowed, a stream being
// updated).
var permanentCodes = []string{
	"ValidationException", "InvalidArgumentException", "SerializationException",
	"ResourceNotFoundException",
}

// throttleCodes are the codes of a limit that passes with time: the
// relay waits at least ThrottleDelay before retrying.
var throttleCodes = []string{
	"ProvisionedThroughputExceededException", "LimitExceededException",
	"KMSThrottlingException", "ThrottlingException",
}

// ThrottleDelay is the least wait the sink asks for after Kinesis
// throttled a record: a shard's write limits are per second.
const ThrottleDelay = time.Second

func permanentCode(code string) bool { return slices.Contains(permanentCodes, code) }

// service reads Kinesis' answers.
var service = awsbatch.Service{Prefix: "outbox: kinesis", Op: "PutRecords", Refused: ErrRefused, Permanent: permanentCode}

// refusal classifies Kinesis' refusal of a record, or of a whole
// request, for stream: permanent by permanentCodes, a throttle with
// ThrottleDelay, anything else retriable.
func refusal(stream, code, msg string) error {
	return throttled(code, service.Refusal(stream, code, msg))
}

// requestErr classifies the failure of a whole PutRecords request: an
// API error as refusal (answered with HTTP 502, 503 or 504, the service
// unavailable), anything else as awsbatch.TransportErr does: a failed
// dial not sent (no attempt counted), a connection lost mid-request or
// no answer in time the service unavailable.
func requestErr(stream string, err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		r := refusal(stream, api.ErrorCode(), api.ErrorMessage())
		if awsbatch.Unavailable(err) && !sinks.IsPermanent(r) {
			return sinks.Unavailable(r)
		}
		return r
	}
	return awsbatch.TransportErr(service.Prefix, err)
}

func throttled(code string, err error) error {
	if slices.Contains(throttleCodes, code) {
		return &sinks.RetryAfterError{Err: err, After: ThrottleDelay}
	}
	return err
}
