package sinkconf_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

type conf struct {
	Name     string
	N        int
	On       bool
	Wait     time.Duration
	Keys     []sinkconf.Secret
	Password sinkconf.Secret `yaml:"password"`
}

var params = sinkconf.NewParams("test", " (hint)",
	sinkconf.String("name", func(c *conf) *string { return &c.Name }),
	sinkconf.Int("n", func(c *conf) *int { return &c.N }),
	sinkconf.Bool("on", func(c *conf) *bool { return &c.On }),
	sinkconf.Duration("wait", func(c *conf) *time.Duration { return &c.Wait }),
	sinkconf.Secrets("key", func(c *conf) *[]sinkconf.Secret { return &c.Keys }),
)

func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	const pw = "hunter2"
	c := conf{Password: pw, Keys: []sinkconf.Secret{pw}}
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("c", "conf", c, "pw", c.Password)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("c", "conf", c, "pw", c.Password)
	js, err := json.Marshal(c)
	require.NoError(t, err)
	ym, err := yaml.Marshal(c)
	require.NoError(t, err)
	for _, out := range []string{fmt.Sprintf("%v %+v %#v %s", c, c, c, c.Password), logged.String(), string(js), string(ym)} {
		require.NotContains(t, out, pw)
	}
	var back conf
	require.NoError(t, yaml.Unmarshal([]byte("password: "+pw), &back))
	require.Equal(t, sinkconf.Secret(pw), back.Password, "decoding reads the real value")
	require.Empty(t, sinkconf.Secret("").String(), "a missing secret stays visible")
}

func TestParams(t *testing.T) {
	t.Parallel()
	var c conf
	require.NoError(t, params.Parse(&c, "name=a&n=3&on=true&wait=2s&key=k1&key=k2"))
	require.Equal(t, conf{Name: "a", N: 3, On: true, Wait: 2 * time.Second, Keys: []sinkconf.Secret{"k1", "k2"}}, c)
	require.Equal(t, url.Values{"name": {"a"}, "n": {"3"}, "on": {"true"}, "wait": {"2s"}, "key": {"xxxxx", "xxxxx"}}, params.Query(&c))
	require.Empty(t, params.Query(&conf{}), "zero fields are unset")
	require.Equal(t, []string{"name", "n", "on", "wait", "key"}, params.Names())

	for q, want := range map[string]string{
		"bogus=1":        `outbox: test: unknown sink URL parameter "bogus" (hint)`,
		"n=1&n=2":        `outbox: test: sink URL parameter "n" given 2 times`,
		"n=x":            `outbox: test: sink URL parameter "n": "x" is not an integer`,
		"on=maybe":       `outbox: test: sink URL parameter "on": "maybe" is not true or false`,
		"wait=5":         `outbox: test: sink URL parameter "wait": "5" is not a duration such as 10s`,
		"name=%zzsecret": `outbox: test: malformed query string`,
	} {
		err := params.Parse(&conf{}, q)
		require.ErrorContains(t, err, want, q)
		require.NotContains(t, err.Error(), "secret", q)
	}
}

// FuzzParams checks that whatever query a table accepts, the query it
// shows back parses to the same configuration.
func FuzzParams(f *testing.F) {
	for _, s := range []string{"name=a&n=3&on=1&wait=1h", "n=+4", "wait=1.5s&on=false", "name=&n=0", "bogus=1", "n=1&n=2", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		var c conf
		if params.Parse(&c, q) != nil || c.Keys != nil {
			return // secrets show redacted, by design
		}
		var back conf
		require.NoError(t, params.Parse(&back, params.Query(&c).Encode()))
		require.Equal(t, c, back)
	})
}

// A target holds the base URL's destination (scheme, host, path, its own
// query but credentials) and the routing parameters that are set, never
// tuning, userinfo or a parameter named like a credential.
func TestTarget(t *testing.T) {
	t.Parallel()
	routed := sinkconf.NewParams("test", "",
		sinkconf.Routing(sinkconf.String("name", func(c *conf) *string { return &c.Name })),
		sinkconf.Duration("wait", func(c *conf) *time.Duration { return &c.Wait }),
		sinkconf.Routing(sinkconf.Secrets("key", func(c *conf) *[]sinkconf.Secret { return &c.Keys })),
	)
	c := conf{Name: "orders", Wait: time.Second, Keys: []sinkconf.Secret{"k1"}}
	got := routed.Target(&c, "HTTPS://u:pw@Hooks.Example/a/b?z=1&token=t&a=2")
	require.Equal(t, "https://hooks.example/a/b?a=2&z=1 name=orders", got)
	c.Wait = time.Minute
	require.Equal(t, got, routed.Target(&c, "https://hooks.example/a/b?z=1&a=2"), "tuning and credentials are left out")
	c.Name = "billing"
	require.NotEqual(t, got, routed.Target(&c, "https://hooks.example/a/b?z=1&a=2"))

	for raw, want := range map[string]string{
		"http://h/":          "http://h",
		"http://h":           "http://h",
		"amqp://u:p@h:5672/": "amqp://h:5672",
		"amqp://h/vh":        "amqp://h/vh",
		"kinesis://":         "kinesis:",
		"http://h/a%2Fb":     "http://h/a%2Fb",
		"http://h/x?secret=": "http://h/x",
	} {
		require.Equal(t, want, sinkconf.TargetURL(raw), raw)
	}
	require.NotContains(t, sinkconf.TargetURL("http://u:hunter2@h/%zz"), "hunter2")
}
