package relay

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The cause the heartbeat records fits a text column: one line, valid
// UTF-8 without NUL, at most maxDownCause characters.
func TestDownCause(t *testing.T) {
	require.Equal(t, "unknown", downCause(nil))
	require.Equal(t, "post: dial tcp: connection refused", downCause(errors.New("post:\n\tdial tcp:\x00 connection refused")))
	got := downCause(errors.New("bad \xff byte"))
	require.True(t, utf8.ValidString(got))
	require.Equal(t, "bad \uFFFD byte", got)
	long := downCause(errors.New(strings.Repeat("é", 2*maxDownCause)))
	require.Equal(t, maxDownCause, utf8.RuneCountInString(long))
	require.True(t, strings.HasSuffix(long, "…"))
}
