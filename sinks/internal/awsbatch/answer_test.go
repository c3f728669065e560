package awsbatch

import (
	"errors"
	"net"
	"slices"
	"testing"

	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

var errRefused = errors.New("outbox: test: refused")

var svc = Service{Prefix: "outbox: test", Op: "SendBatch", Refused: errRefused,
	Permanent: func(code string) bool { return slices.Contains([]string{"Invalid"}, code) }}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	req := []*Entry{{I: 0, Dest: "q"}, {I: 1, Dest: "q"}, {I: 2, Dest: "q"}, {I: 3, Dest: "q"}}
	errs := svc.Outcomes(req, nil, []string{"0"}, []Failure{{ID: "1", Code: "Invalid", Message: "bad"}, {ID: "2", Code: "Throttled", Message: "slow"}})
	require.Len(t, errs, 4)
	require.NoError(t, errs[0], "accepted")
	require.True(t, sinks.IsPermanent(errs[1]), "a permanent code")
	require.ErrorContains(t, errs[1], "outbox: test: refused: q: Invalid: bad")
	require.ErrorIs(t, errs[2], errRefused)
	require.False(t, sinks.IsPermanent(errs[2]), "any other code is retried")
	require.EqualError(t, errs[3], "outbox: test: refused: SendBatch to q answered nothing for entry 3")
}

func TestOutcomesOfAFailedRequest(t *testing.T) {
	t.Parallel()
	req := []*Entry{{I: 0, Dest: "q"}, {I: 1, Dest: "q"}}
	api := svc.Outcomes(req, &smithy.GenericAPIError{Code: "Invalid", Message: "no such queue"}, nil, nil)
	for _, err := range api {
		require.True(t, sinks.IsPermanent(err))
		require.ErrorIs(t, err, errRefused)
	}
	dial := svc.Outcomes(req, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, nil, nil)
	for _, err := range dial {
		require.ErrorIs(t, err, sinks.ErrNotAttempted, "a failed dial sent nothing")
	}
}
