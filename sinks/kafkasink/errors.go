package kafkasink

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// permanentCodes are the broker answers that say this record can never be
// accepted as it is: retrying the same bytes gives the same answer.
//
// Every code here is one kafka-go reports as not Temporary(). The reverse
// does not hold on purpose: other non-temporary codes (authentication and
// authorization failures, UNSUPPORTED_VERSION, UNKNOWN_SERVER_ERROR,
// cluster-level errors) describe the client's credentials, ACLs or the
// cluster, not the message. Dead-lettering on them would move a whole
// stream to the dead-letter table during a misconfiguration; kept
// retriable, the rows wait (and the relay's max attempts still bounds
// them).
//
// UNKNOWN_TOPIC_OR_PARTITION is deliberately absent: in a produce response
// it is transient (partition moving, metadata propagating). A topic is
// reported missing, permanently, only from fresh metadata and only when
// allow_auto_topic_creation is off (see Sink.resolveTopics).
//
// INVALID_TIMESTAMP is absent too: it says that a clock (the database's,
// which stamps the records, or the broker's) is off, or that the topic's
// timestamp window is narrower than the backlog's age. The sink resends
// the batch stamped with the send time (Sink.failed); if that is refused
// as well, the rows wait for the clocks to be fixed, as they do for
// credentials.
var permanentCodes = map[kafka.Error]bool{
	kafka.MessageSizeTooLarge:         true, // record batch above message.max.bytes
	kafka.RecordListTooLarge:          true, // request above the broker's limit
	kafka.InvalidTopic:                true,
	kafka.InvalidRecord:               true, // e.g. a compacted topic and no key
	kafka.UnsupportedForMessageFormat: true,
}

// isPermanentCode reports whether a produce error rejects the records
// themselves. It unwraps, so it works on errors built by produceError.
func isPermanentCode(err error) bool {
	var ke kafka.Error
	return errors.As(err, &ke) && permanentCodes[ke]
}

// unavailableCodes are the broker answers that say the partition's
// broker, not the record, cannot take writes now: no leader, a leader
// that moved, too few in-sync replicas, no answer of the followers in
// time, a failed log directory. The error wraps sinks.ErrUnavailable:
// retriable like any other, and evidence of an outage for the relay when
// it spans two keys or more of a batch of which nothing got through (see
// sinks.ErrUnavailable). UNKNOWN_TOPIC_OR_PARTITION is not among them: it
// may say that the topic is missing.
var unavailableCodes = map[kafka.Error]bool{
	kafka.LeaderNotAvailable:           true,
	kafka.NotLeaderForPartition:        true, // NOT_LEADER_OR_FOLLOWER
	kafka.RequestTimedOut:              true,
	kafka.BrokerNotAvailable:           true,
	kafka.NotEnoughReplicas:            true,
	kafka.NotEnoughReplicasAfterAppend: true,
	kafka.KafkaStorageError:            true,
}

// produceError describes a per-partition error code from a produce
// response. It wraps kafka.Error, so errors.Is(err, kafka.MessageSizeTooLarge)
// works for callers, and sinks.ErrUnavailable for unavailableCodes.
func produceError(topic string, partition int32, code int16, msg string) error {
	ke := kafka.Error(code)
	var err error
	if msg != "" && msg != ke.Description() {
		err = fmt.Errorf("outbox: kafka: produce to %s[%d]: %w (%s)", topic, partition, ke, msg)
	} else {
		err = fmt.Errorf("outbox: kafka: produce to %s[%d]: %w", topic, partition, ke)
	}
	if unavailableCodes[ke] {
		return sinks.Unavailable(err)
	}
	return err
}

// classify marks err permanent when retrying cannot help.
func classify(err error) error {
	if isPermanentCode(err) {
		return sinks.Permanent(err)
	}
	return err
}

// AuthError is a connection to a broker that failed while authenticating
// (SASL): the broker refused the credentials (SASL_AUTHENTICATION_FAILED),
// does not offer the mechanism (UNSUPPORTED_SASL_MECHANISM), or the
// mechanism itself failed (a SCRAM server signature that does not verify,
// AWS credentials that cannot be retrieved). It happens before any
// request of the sink goes out on that connection, so a Send reports it
// as not sent (see notSent): wrong credentials are a configuration
// problem, not the messages' fault, and they spend no attempts.
type AuthError struct {
	// Who names the mechanism and user ("sasl.mechanism plain, user
	// \"relay\""); never the password.
	Who string
	Err error
}

func (e *AuthError) Error() string {
	return "SASL authentication failed (" + e.Who + "; check the sasl settings): " + e.Err.Error()
}

func (e *AuthError) Unwrap() error { return e.Err }

// saslCodes are the broker answers to the SASL exchange kafka-go reports
// as errors.
var saslCodes = []kafka.Error{kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState}

// authErr returns err as an *AuthError when it is a SASL answer of the
// broker, naming who; any other error as is.
func authErr(err error, who string) error {
	var ae *AuthError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	for _, code := range saslCodes {
		if errors.Is(err, code) {
			return &AuthError{Who: who, Err: err}
		}
	}
	return err
}

// notSent marks a failure that happened before any byte of a request
// went out (see sinks.NotSent): the broker could not be dialled (connection refused, no route,
// a name that does not resolve, the dial timeout), the transport knows no
// connection to it, or the connection failed while authenticating
// (*AuthError). The messages were certainly not delivered, so the
// error matches sinks.ErrNotAttempted as well as its cause: the relay
// leaves their rows untouched, neither counting an attempt nor storing a
// backoff in them, and its worker backs off before claiming again. A
// cluster that is down thus costs no attempts, and once it is back the
// rows go at the worker's next try (its backoff is capped at a few
// seconds) instead of at each row's exponential retry time, which after a
// 30 s outage lay up to 39 s past the recovery. Any other error is
// returned as is.
func notSent(err error) error {
	var ae *AuthError
	if sinks.Unreached(err) || errors.Is(err, kafka.BrokerNotAvailable) || errors.As(err, &ae) {
		return sinks.NotSent(err)
	}
	return err
}
