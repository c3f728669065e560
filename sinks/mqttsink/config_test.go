package mqttsink

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := ParseURL("mqtts://relay:s%40cret@b1,b2:8884?topic=events/{topic}&client_id=r1&keepalive=20s&session_expiry=1m&tls_ca_file=/ca.pem")
	require.NoError(t, err)
	require.Equal(t, "events/{topic}", c.Topic)
	require.Equal(t, "r1", c.ClientID)
	require.Equal(t, 20*time.Second, c.KeepAlive)
	require.Equal(t, time.Minute, c.SessionExpiry)
	b, err := parseBrokers(c.URL)
	require.NoError(t, err)
	require.True(t, b.tls)
	require.Equal(t, "mqtts://b1:8883", b.urls[0].String())
	require.Equal(t, "mqtts://b2:8884", b.urls[1].String())
	user, pass := c.credentials(b)
	require.Equal(t, "relay", user)
	require.Equal(t, "s@cret", string(pass))
	red := c.Redacted()
	require.NotContains(t, red, "cret")
	require.Contains(t, red, "relay:xxxxx@")

	c, err = ParseURL("mqtt://127.0.0.1?username=u&password=topsecret")
	require.NoError(t, err)
	b, _ = parseBrokers(c.URL)
	require.Equal(t, "mqtt://127.0.0.1:1883", b.urls[0].String())
	user, pass = c.credentials(b)
	require.Equal(t, "u", user)
	require.Equal(t, "topsecret", string(pass))
	require.NotContains(t, c.Redacted(), "topsecret")
}

func TestParseURLErrors(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"mqtt://h?nope=1":              `unknown sink URL parameter "nope"`,
		"http://h":                     "scheme must be mqtt or mqtts",
		"mqtt://":                      "host is missing",
		"mqtt://h:0":                   "port must be between",
		"mqtt://h?topic=a/%2B/{topic}": "wildcard",
		"mqtt://h?topic=a/%23":         "wildcard",
		"mqtt://h?topic={nope}":        "unknown placeholder",
		"mqtt://h?keepalive=1.5s":      "whole seconds",
		"mqtt://h?keepalive=100000s":   "keepalive: at most",
		"mqtt://h?tls=true":            "use mqtts://",
		"mqtt://u:p@h?password=x":      "password: set both",
		"mqtt://h?reconnect_initial=1m&reconnect_max=1s": "reconnect_max",
		"mqtt://u:hunter2@h/path":                        "path",
	} {
		_, err := ParseURL(raw)
		require.Error(t, err, raw)
		require.Contains(t, err.Error(), want, raw)
		require.False(t, strings.Contains(err.Error(), "hunter2"), "secret in error: %v", err)
	}
}

func TestDefaultClientIDUnique(t *testing.T) {
	t.Parallel()
	a, b := Config{}.withDefaults(), Config{}.withDefaults()
	require.True(t, strings.HasPrefix(a.ClientID, DefaultClientIDPrefix))
	require.NotEqual(t, a.ClientID, b.ClientID)
}
