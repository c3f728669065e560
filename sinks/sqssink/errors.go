package sqssink

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/awsbatch"
)

// permanentCodes are the SQS error codes that say a message, or its
// queue, can never be accepted: the message is dead-lettered at once.
// Every other code is retried (throttling, internal errors, KMS and
// credential trouble an operator can fix), bounded by max attempts.
var permanentCodes = []string{
	"InvalidParameterValue", "InvalidMessageContents", "MessageTooLong",
	"InvalidAttributeName", "InvalidAttributeValue", "InvalidBatchEntryId",
	"BatchRequestTooLong", "TooManyEntriesInBatchRequest", "BatchEntryIdsNotDistinct",
	"MissingParameter", "UnsupportedOperation",
	"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue",
}

func permanentCode(code string) bool {
	return slices.Contains(permanentCodes, strings.TrimPrefix(code, "com.amazonaws.sqs#"))
}

// entryErr classifies SQS's refusal of one batch entry.
func entryErr(queue string, f types.BatchResultErrorEntry) error {
	code := aws.ToString(f.Code)
	err := fmt.Errorf("%w: %s: %s: %s", ErrRefused, queue, code, aws.ToString(f.Message))
	if permanentCode(code) {
		return sinks.Permanent(err)
	}
	return err
}

// requestErr classifies the failure of a whole SendMessageBatch: an API
// error by its code (as entryErr), a failed dial as not sent, anything
// else (a connection lost mid-request, a timeout) as retriable.
func requestErr(queue string, err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		e := fmt.Errorf("%w: %s: %s: %s", ErrRefused, queue, api.ErrorCode(), api.ErrorMessage())
		if permanentCode(api.ErrorCode()) {
			return sinks.Permanent(e)
		}
		return e
	}
	return awsbatch.TransportErr("outbox: sqs", err)
}
