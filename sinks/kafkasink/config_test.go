package kafkasink

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/sinks"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	cfg, err := ParseURL("kafka://relay:pa%24%24@h1:9092,h2:9093?client_id=me&topic_prefix=prod.&topic_map=orders:o.v1,users:u&balancer=crc32" +
		"&max_message_bytes=2000000&write_timeout=3s&dial_timeout=1s&metadata_ttl=2s&allow_auto_topic_creation=true&idempotent=false" +
		"&tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_insecure_skip_verify=false&sasl_mechanism=scram-sha-256")
	require.NoError(t, err)
	require.Equal(t, Config{
		Brokers:                []string{"h1:9092", "h2:9093"},
		ClientID:               "me",
		TopicPrefix:            "prod.",
		TopicMap:               map[string]string{"orders": "o.v1", "users": "u"},
		Balancer:               "crc32",
		MaxMessageBytes:        2000000,
		WriteTimeout:           3 * time.Second,
		DialTimeout:            time.Second,
		MetadataTTL:            2 * time.Second,
		AllowAutoTopicCreation: true,
		Idempotent:             ptr(false),
		TLS:                    TLSConfig{Enable: true, CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem"},
		SASL:                   SASLConfig{Mechanism: "scram-sha-256", Username: "relay", Password: "pa$$"},
	}, cfg)
	require.NoError(t, cfg.Validate())

	cfg, err = ParseURL("kafka://localhost:9092")
	require.NoError(t, err)
	require.Equal(t, Config{Brokers: []string{"localhost:9092"}}, cfg)
	require.NoError(t, cfg.Validate())

	cfg, err = ParseURL("kafka://u:p@localhost:9092")
	require.NoError(t, err)
	require.Empty(t, cfg.SASL.Mechanism, "the URL sets no mechanism: a config-file section may still choose one")
	require.Equal(t, SASLScramSHA512, cfg.withDefaults().SASL.Mechanism, "credentials default to SCRAM-SHA-512")
	require.NoError(t, cfg.Validate())

	cfg, err = ParseURL("kafka://b-1.msk.example:9098?tls=true&sasl_mechanism=aws-msk-iam&sasl_aws_region=eu-west-1")
	require.NoError(t, err)
	require.Equal(t, SASLConfig{Mechanism: SASLAWSMSKIAM, AWSRegion: "eu-west-1"}, cfg.SASL)
	require.NoError(t, cfg.Validate())
	require.Equal(t, "kafka://b-1.msk.example:9098?sasl_aws_region=eu-west-1&sasl_mechanism=aws-msk-iam&tls=true", cfg.Redacted())
}

func TestParseURLErrors(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"http://h:9092":                          `scheme is "http"`,
		"kafka://":                               "no brokers",
		"kafka://h:9092/path":                    "path",
		"kafka://h:9092?acks=1":                  `unknown sink URL parameter "acks"`,
		"kafka://h:9092?client_id=a&client_id=b": `"client_id" given 2 times`,
		"kafka://h:9092?write_timeout=soon":      "write_timeout",
		"kafka://h:9092?tls=maybe":               "tls",
		"kafka://h:9092?topic_map=a":             "topic_map",
		"kafka://h:9092?topic_map=a:b,a:c":       "mapped twice",
		"kafka://h:9092?max_message_bytes=lots":  "max_message_bytes",
		"kafka://h:9092?idempotent=sometimes":    `"idempotent": "sometimes" is not true or false`,
	} {
		_, err := ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: kafka: "), err.Error())
	}
}

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	ok := Config{Brokers: []string{"h:9092"}}
	for field, mod := range map[string]func(*Config){
		"brokers":                          func(c *Config) { c.Brokers = nil },
		"brokers:":                         func(c *Config) { c.Brokers = []string{"nohost"} },
		"topic_prefix":                     func(c *Config) { c.TopicPrefix = "bad prefix" },
		"topic_map":                        func(c *Config) { c.TopicMap = map[string]string{"a": "b/c"} },
		"balancer":                         func(c *Config) { c.Balancer = "roundrobin" },
		"max_message_bytes":                func(c *Config) { c.MaxMessageBytes = 10 },
		"write_timeout":                    func(c *Config) { c.WriteTimeout = -time.Second },
		"dial_timeout":                     func(c *Config) { c.DialTimeout = -time.Second },
		"metadata_ttl":                     func(c *Config) { c.MetadataTTL = -time.Second },
		"tls.cert_file":                    func(c *Config) { c.TLS = TLSConfig{Enable: true, CertFile: "/c.pem"} },
		"sasl.mechanism":                   func(c *Config) { c.SASL.Mechanism = "gssapi" },
		"sasl.password: default mechanism": func(c *Config) { c.SASL.Username = "u" }, // scram-sha-512 needs both
		"sasl.username":                    func(c *Config) { c.SASL = SASLConfig{Mechanism: "plain", Password: "p"} },
		"sasl.password":                    func(c *Config) { c.SASL = SASLConfig{Mechanism: "plain", Username: "u"} },
		"sasl.aws_region": func(c *Config) {
			c.SASL = SASLConfig{Mechanism: "plain", Username: "u", Password: "p", AWSRegion: "eu-west-1"}
		},
		"sasl.username: iam": func(c *Config) {
			c.TLS.Enable = true
			c.SASL = SASLConfig{Mechanism: SASLAWSMSKIAM, Username: "u", Password: "p"}
		},
		"tls.enable": func(c *Config) { c.SASL = SASLConfig{Mechanism: SASLAWSMSKIAM, AWSRegion: "eu-west-1"} },
	} {
		c := ok
		mod(&c)
		err := c.Validate()
		name, _, _ := strings.Cut(field, ":")
		require.ErrorContains(t, err, "outbox: kafka: "+name+":", field)
	}
	require.NoError(t, ok.Validate())
	_, err := New(Config{}, nil)
	require.ErrorContains(t, err, "brokers")

	// SCRAM and PLAIN without TLS are valid (a private network, a local
	// broker); docs/sinks/kafka.md says what travels in clear.
	require.NoError(t, Config{Brokers: []string{"h:9092"}, SASL: SASLConfig{Mechanism: SASLScramSHA512, Username: "u", Password: "p"}}.Validate())
	require.NoError(t, Config{Brokers: []string{"h:9098"}, TLS: TLSConfig{Enable: true}, SASL: SASLConfig{Mechanism: SASLAWSMSKIAM}}.Validate(),
		"the region may come from the AWS SDK's chain")
}

// idempotent has three states: unset (on where the brokers support it),
// true (required) and false (off); false is a value, in the URL, the
// config file and the redacted URL alike, and a URL and a section that
// disagree are refused with both values shown.
func TestIdempotentOption(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]idempotence{
		"kafka://h:9092":                 idempotenceAuto,
		"kafka://h:9092?idempotent=true": idempotenceRequired,
		"kafka://h:9092?idempotent=0":    idempotenceOff,
	} {
		cfg, err := ParseURL(raw)
		require.NoError(t, err)
		require.Equal(t, want, cfg.idempotence(), raw)
		again, err := ParseURL(cfg.Redacted())
		require.NoError(t, err)
		require.Equal(t, cfg.Idempotent, again.Idempotent, "Redacted keeps it: %s", cfg.Redacted())
	}
	var fromYAML Config
	require.NoError(t, yaml.Unmarshal([]byte("idempotent: false\n"), &fromYAML))
	require.Equal(t, idempotenceOff, fromYAML.idempotence())

	section := func(text string) sinks.Decoder {
		return func(dst any) error { return yaml.Unmarshal([]byte(text), dst) }
	}
	_, err := Driver.Parse("kafka://h:9092?idempotent=false", section("client_id: c\n"))
	require.NoError(t, err, "the URL's false is kept beside the section")
	_, err = Driver.Parse("kafka://h:9092", section("idempotent: false\n"))
	require.NoError(t, err)
	_, err = Driver.Parse("kafka://h:9092?idempotent=true", section("idempotent: false\n"))
	var conflict *sinks.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, "idempotent", conflict.Key)
	require.Equal(t, " (sink URL true, section false)", conflict.Values())
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Brokers: []string{"127.0.0.1:1"}}, nil)
	require.NoError(t, err)
	c := s.Config()
	require.Equal(t, DefaultClientID, c.ClientID)
	require.Equal(t, BalancerMurmur2, c.Balancer)
	require.Equal(t, DefaultMaxMessageBytes, c.MaxMessageBytes)
	require.Equal(t, DefaultWriteTimeout, c.WriteTimeout)
	require.Equal(t, DefaultDialTimeout, c.DialTimeout)
	require.Equal(t, DefaultMetadataTTL, c.MetadataTTL)
	require.False(t, c.AllowAutoTopicCreation)
	require.Nil(t, c.Idempotent, "on where the brokers support it")
	require.NotNil(t, s.producer)
	require.NoError(t, s.Close(t.Context()))
}

// The password must not reach any printed or encoded form of the config,
// nor ParseURL's errors.
func TestPasswordIsRedactedEverywhere(t *testing.T) {
	t.Parallel()
	const pw = "hunter2-secret"
	cfg, err := ParseURL("kafka://relay:" + pw + "@h:9092?sasl_mechanism=plain")
	require.NoError(t, err)
	require.Equal(t, Secret(pw), cfg.SASL.Password)

	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("cfg", "config", cfg, "sasl", cfg.SASL)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("cfg", "config", cfg, "sasl", cfg.SASL)
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	ym, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	for _, out := range []string{
		cfg.Redacted(), cfg.String(),
		fmt.Sprint(cfg), fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg),
		fmt.Sprintf("%v %+v %#v", cfg.SASL, cfg.SASL, cfg.SASL),
		logged.String(), string(js), string(ym),
	} {
		require.NotContains(t, out, pw)
	}
	require.Contains(t, cfg.Redacted(), "relay:xxxxx@h:9092")

	_, err = ParseURL("kafka://relay:" + pw + "@h:9092?nope=1")
	require.NotContains(t, err.Error(), pw)
	_, err = ParseURL("kafka://relay:" + pw + "@h:9092/%zz")
	require.Error(t, err)
	require.NotContains(t, err.Error(), pw)

	// YAML input still reads the real value.
	var fromYAML Config
	require.NoError(t, yaml.Unmarshal([]byte("sasl:\n  password: "+pw+"\nwrite_timeout: 3s\n"), &fromYAML))
	require.Equal(t, Secret(pw), fromYAML.SASL.Password)
	require.Equal(t, 3*time.Second, fromYAML.WriteTimeout)
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"kafka://h:9092", "kafka://u:p@h1:1,h2:2?tls=true", "kafka://h:9092?topic_map=a:b,c:d",
		"kafka://h:9092?write_timeout=1s&balancer=fnv1a", "kafka://[::1]:9092", "kafka:opaque",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		cfg, err := ParseURL(raw)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "outbox: kafka: "), err.Error())
			return
		}
		_ = cfg.Validate()
		_ = cfg.Redacted()
		if cfg.SASL.Password != "" && len(cfg.SASL.Password) > 5 {
			require.NotContains(t, cfg.Redacted(), string(cfg.SASL.Password))
		}
	})
}

// The Azure Event Hubs recipe of docs/sinks/kafka.md as one URL: the
// username is the literal $ConnectionString, the password the namespace's
// connection string, percent-encoded.
func TestParseURLEventHubs(t *testing.T) {
	t.Parallel()
	const cs = "Endpoint=sb://NAMESPACE.servicebus.windows.net/;SharedAccessKeyName=relay;SharedAccessKey=KEY"
	cfg, err := ParseURL("kafka://$ConnectionString:Endpoint%3Dsb%3A%2F%2FNAMESPACE.servicebus.windows.net%2F%3BSharedAccessKeyName%3Drelay%3BSharedAccessKey%3DKEY@NAMESPACE.servicebus.windows.net:9093?tls=true&sasl_mechanism=plain")
	require.NoError(t, err)
	require.Equal(t, SASLConfig{Mechanism: SASLPlain, Username: "$ConnectionString", Password: cs}, cfg.SASL)
	require.Equal(t, []string{"NAMESPACE.servicebus.windows.net:9093"}, cfg.Brokers)
	require.True(t, cfg.TLS.Enable)
	require.NoError(t, cfg.Validate())
	require.NotContains(t, cfg.Redacted(), "KEY")
	require.Contains(t, cfg.Redacted(), "xxxxx")
}
