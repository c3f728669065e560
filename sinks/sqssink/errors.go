package sqssink

import (
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

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

// service reads SQS's answers.
var service = awsbatch.Service{Prefix: "outbox: sqs", Op: "SendMessageBatch", Refused: ErrRefused, Permanent: permanentCode}

// failure reads SQS's refusal of a batch entry.
func failure(f types.BatchResultErrorEntry) (id, code, msg *string) { return f.Id, f.Code, f.Message }

// entryErr classifies SQS's refusal of one batch entry.
func entryErr(queue string, f types.BatchResultErrorEntry) error {
	return service.Refusal(queue, aws.ToString(f.Code), aws.ToString(f.Message))
}
