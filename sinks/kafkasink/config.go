package kafkasink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	mskiam "github.com/segmentio/kafka-go/sasl/aws_msk_iam_v2"
	"github.com/segmentio/kafka-go/sasl/plain"
	franzsasl "github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultClientID        = "outbox-relay"
	DefaultBalancer        = BalancerMurmur2
	DefaultMaxMessageBytes = 1 << 20 // 1 MiB, the Java producer's max.request.size
	DefaultWriteTimeout    = 10 * time.Second
	DefaultDialTimeout     = 5 * time.Second
	DefaultMetadataTTL     = 6 * time.Second
)

// Balancer names accepted in Config.Balancer.
const (
	// BalancerMurmur2 hashes keys exactly like the Java client's default
	// partitioner (murmur2, high bit masked, modulo the partition count), so
	// a key lands on the same partition whichever client wrote it.
	BalancerMurmur2 = "murmur2"
	// BalancerCRC32 matches librdkafka's "consistent_random" partitioner.
	BalancerCRC32 = "crc32"
	// BalancerFNV1a matches Sarama's default hash partitioner.
	BalancerFNV1a = "fnv1a"
)

// SASL mechanism names accepted in SASLConfig.Mechanism.
const (
	SASLPlain       = "plain"
	SASLScramSHA256 = "scram-sha-256"
	SASLScramSHA512 = "scram-sha-512"
	// SASLAWSMSKIAM is Amazon MSK's IAM access control (SASL mechanism
	// AWS_MSK_IAM): a SigV4-signed request from the AWS SDK's default
	// credential chain instead of a username and password.
	SASLAWSMSKIAM = "aws-msk-iam"
)

// Secret is the string type of passwords: it never prints (see
// sinkconf.Secret).
type Secret = sinkconf.Secret

// Config configures the Kafka sink. The zero value of every optional field
// means "use the default" documented on the field.
type Config struct {
	// Brokers are the bootstrap brokers as host:port. Required.
	Brokers []string `yaml:"brokers"`
	// ClientID is sent to the brokers with every request (quotas, logs).
	// Default "outbox-relay".
	ClientID string `yaml:"client_id"`
	// TopicPrefix is prepended to every outbox topic that TopicMap does not
	// name. Default "" (the Kafka topic is the outbox topic).
	TopicPrefix string `yaml:"topic_prefix"`
	// TopicMap maps an outbox topic to a Kafka topic. A mapped topic is used
	// as is (TopicPrefix is not applied). Default: no mapping.
	TopicMap map[string]string `yaml:"topic_map"`
	// Balancer chooses the partition of a keyed message: "murmur2" (the
	// Java client's partitioner), "crc32" (librdkafka) or "fnv1a" (Sarama).
	// Messages without a key go to a random partition. Default "murmur2".
	Balancer string `yaml:"balancer"`
	// MaxMessageBytes is the largest record batch the sink sends to one
	// partition, and so the largest single message it accepts (estimated
	// encoded size, key, value and headers included). Keep it at or below
	// the broker's message.max.bytes (and the topic's max.message.bytes).
	// A message above it is failed as permanent without a round trip.
	// Default 1048576.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// WriteTimeout bounds one produce request, including the broker's wait
	// for acks=all. Default 10s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// DialTimeout bounds connecting to a broker, TLS and SASL included.
	// Default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// MetadataTTL is how long cluster metadata (partition counts, leaders)
	// is cached before it is refreshed. After a leader change, sends to the
	// moved partitions fail (retriably) until the next refresh. Default 6s.
	MetadataTTL time.Duration `yaml:"metadata_ttl"`
	// AllowAutoTopicCreation asks the brokers to create missing topics (the
	// brokers' auto.create.topics.enable must allow it too). When false, a
	// message for a topic that does not exist fails as permanent.
	// Default false.
	AllowAutoTopicCreation bool `yaml:"allow_auto_topic_creation"`
	// Idempotent turns Kafka's idempotent producer on or off (see Send):
	// the brokers then drop a record batch the sink sends again after its
	// answer was lost, instead of appending it twice.
	//
	//   - nil (the default): on where the brokers support it. Brokers that
	//     refuse it (before Kafka 0.11, or ACLs without IDEMPOTENT_WRITE)
	//     are told apart at the first Send: the sink logs a warning and
	//     produces without it.
	//   - true: required. Sends fail, not attempted, with an error naming
	//     this option while the brokers refuse it.
	//   - false: off, as kafka-go's own producer.
	Idempotent *bool `yaml:"idempotent"`
	// TLS configures encrypted connections (see sinkconf.TLS): on when
	// tls.enable or any other TLS field is set. Default: plaintext.
	TLS sinkconf.TLS `yaml:"tls"`
	// SASL configures authentication. Default: none.
	SASL SASLConfig `yaml:"sasl"`
}

// TLSConfig is the TLS section, the one every sink that dials a broker
// shares (see sinkconf.TLS).
type TLSConfig = sinkconf.TLS

// SASLConfig configures SASL authentication.
type SASLConfig struct {
	// Mechanism is "plain", "scram-sha-256", "scram-sha-512" or
	// "aws-msk-iam". Default: "scram-sha-512" when Username or Password
	// is set (by the URL's user info or the section), else "" (SASL off).
	Mechanism string `yaml:"mechanism"`
	// Username is required with plain and SCRAM, refused with aws-msk-iam.
	Username string `yaml:"username"`
	// Password is required with plain and SCRAM, refused with aws-msk-iam.
	// It is never printed.
	Password Secret `yaml:"password"`
	// AWSRegion is the region of the MSK cluster, for aws-msk-iam only
	// (the region is part of the signature). Default: the AWS SDK's chain
	// (AWS_REGION, the shared config file); New fails when neither names
	// one.
	AWSRegion string `yaml:"aws_region"`
}

// ParseURL parses a --sink URL of the form
//
//	kafka://[user:password@]host1:9092,host2:9092[?param=value&...]
//
// The user info, when present, sets SASL.Username and SASL.Password
// (SASL.Mechanism then defaults to "scram-sha-512"). Query parameters,
// each at most once; any other is an error:
//
//	client_id, topic_prefix, topic_map (out1:kafka1,out2:kafka2), balancer,
//	max_message_bytes, write_timeout, dial_timeout, metadata_ttl (Go
//	durations), allow_auto_topic_creation (bool), idempotent (bool; unset
//	means on where the brokers support it), sasl_mechanism,
//	sasl_aws_region, and the
//	TLS parameters of sinkconf.TLSParams: tls (bool), tls_ca_file,
//	tls_cert_file, tls_key_file, tls_server_name,
//	tls_insecure_skip_verify (bool).
//
// ParseURL does not apply defaults; New does.
func ParseURL(raw string) (Config, error) {
	var cfg Config
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole URL, password included: do not wrap it.
		return cfg, errors.New("outbox: kafka: sink URL does not parse (expected kafka://host:port[,host:port...][?param=value])")
	}
	if u.Scheme != "kafka" {
		return cfg, fmt.Errorf("outbox: kafka: sink URL scheme is %q, want \"kafka\"", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return cfg, errors.New("outbox: kafka: sink URL has no brokers (expected kafka://host:port[,host:port...])")
	}
	if u.Path != "" && u.Path != "/" {
		return cfg, fmt.Errorf("outbox: kafka: sink URL has a path %q; the Kafka sink takes none", redact.URL(u.Path))
	}
	if u.Fragment != "" {
		return cfg, errors.New("outbox: kafka: sink URL has a fragment; the Kafka sink takes none")
	}
	for _, b := range strings.Split(u.Host, ",") {
		cfg.Brokers = append(cfg.Brokers, strings.TrimSpace(b))
	}
	if u.User != nil {
		// The mechanism stays unset: scram-sha-512 is its default with
		// credentials (withDefaults), and a sasl.mechanism of the config
		// file's section may still choose another.
		cfg.SASL.Username = u.User.Username()
		if p, ok := u.User.Password(); ok {
			cfg.SASL.Password = Secret(p)
		}
	}

	if err := params.Parse(&cfg, u.RawQuery); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// params are the URL query parameters; Redacted shows them back.
var params = sinkconf.NewParams("kafka", "",
	sinkconf.String("client_id", func(c *Config) *string { return &c.ClientID }),
	sinkconf.Routing(sinkconf.String("topic_prefix", func(c *Config) *string { return &c.TopicPrefix })),
	sinkconf.Routing(sinkconf.Func("topic_map", setTopicMap, topicMapString)),
	sinkconf.Routing(sinkconf.String("balancer", func(c *Config) *string { return &c.Balancer })),
	sinkconf.Int("max_message_bytes", func(c *Config) *int { return &c.MaxMessageBytes }),
	sinkconf.Duration("write_timeout", func(c *Config) *time.Duration { return &c.WriteTimeout }),
	sinkconf.Duration("dial_timeout", func(c *Config) *time.Duration { return &c.DialTimeout }),
	sinkconf.Duration("metadata_ttl", func(c *Config) *time.Duration { return &c.MetadataTTL }),
	sinkconf.Bool("allow_auto_topic_creation", func(c *Config) *bool { return &c.AllowAutoTopicCreation }),
	sinkconf.Func("idempotent", setIdempotent, idempotentString),
	sinkconf.String("sasl_mechanism", func(c *Config) *string { return &c.SASL.Mechanism }),
	sinkconf.String("sasl_aws_region", func(c *Config) *string { return &c.SASL.AWSRegion }),
).With(sinkconf.TLSParams(func(c *Config) *sinkconf.TLS { return &c.TLS })...)

// setIdempotent parses the idempotent parameter. Unlike the other
// booleans it has three states (see Config.Idempotent), so false is a
// value, not "unset".
func setIdempotent(cfg *Config, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%q is not true or false", redact.URL(v))
	}
	cfg.Idempotent = &b
	return nil
}

func idempotentString(cfg *Config) string {
	if cfg.Idempotent == nil {
		return ""
	}
	return strconv.FormatBool(*cfg.Idempotent)
}

// idempotence is how the sink uses the idempotent producer.
type idempotence int

const (
	idempotenceAuto     idempotence = iota // on where the brokers support it
	idempotenceRequired                    // on, or Sends fail
	idempotenceOff
)

func (c Config) idempotence() idempotence {
	switch {
	case c.Idempotent == nil:
		return idempotenceAuto
	case *c.Idempotent:
		return idempotenceRequired
	default:
		return idempotenceOff
	}
}

func setTopicMap(cfg *Config, v string) error {
	cfg.TopicMap = map[string]string{}
	for _, pair := range strings.Split(v, ",") {
		from, to, ok := strings.Cut(pair, ":")
		if !ok || from == "" || to == "" {
			return errors.New("want outbox_topic:kafka_topic[,outbox_topic:kafka_topic...]")
		}
		if _, dup := cfg.TopicMap[from]; dup {
			return fmt.Errorf("topic %q mapped twice", redact.URL(from))
		}
		cfg.TopicMap[from] = to
	}
	return nil
}

func topicMapString(cfg *Config) string {
	pairs := make([]string, 0, len(cfg.TopicMap))
	for from, to := range cfg.TopicMap {
		pairs = append(pairs, from+":"+to)
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

// withDefaults returns c with every zero optional field set to its default.
func (c Config) withDefaults() Config {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.Balancer == "" {
		c.Balancer = DefaultBalancer
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MetadataTTL == 0 {
		c.MetadataTTL = DefaultMetadataTTL
	}
	c.SASL = c.SASL.withDefaults()
	return c
}

// withDefaults returns a with the mechanism credentials imply when none
// is set.
func (a SASLConfig) withDefaults() SASLConfig {
	if a.Mechanism == "" && (a.Username != "" || a.Password != "") {
		a.Mechanism = SASLScramSHA512
	}
	return a
}

// Validate reports the first invalid field, by its YAML name. Zero optional
// fields are valid (New applies defaults).
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("outbox: kafka: brokers: at least one broker is required")
	}
	for _, b := range c.Brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return fmt.Errorf("outbox: kafka: brokers: %q is not host:port", redact.URL(b))
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("outbox: kafka: brokers: %q has an invalid port", redact.URL(b))
		}
	}
	if err := validTopicName(c.TopicPrefix, true); err != nil {
		return fmt.Errorf("outbox: kafka: topic_prefix: %w", err)
	}
	for _, from := range slices.Sorted(maps.Keys(c.TopicMap)) { // the same error every time
		to := c.TopicMap[from]
		if from == "" {
			return errors.New("outbox: kafka: topic_map: empty outbox topic")
		}
		if err := validTopicName(to, false); err != nil {
			return fmt.Errorf("outbox: kafka: topic_map: %q: %w", redact.URL(from), err)
		}
	}
	switch c.Balancer {
	case "", BalancerMurmur2, BalancerCRC32, BalancerFNV1a:
	default:
		return fmt.Errorf("outbox: kafka: balancer: %q is not one of murmur2, crc32, fnv1a", redact.URL(c.Balancer))
	}
	if c.MaxMessageBytes < 0 || (c.MaxMessageBytes > 0 && c.MaxMessageBytes < recordBatchOverhead+64) {
		return fmt.Errorf("outbox: kafka: max_message_bytes: %d is too small (minimum %d)", c.MaxMessageBytes, recordBatchOverhead+64)
	}
	if c.WriteTimeout < 0 {
		return fmt.Errorf("outbox: kafka: write_timeout: %s is negative", c.WriteTimeout)
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("outbox: kafka: dial_timeout: %s is negative", c.DialTimeout)
	}
	if c.MetadataTTL < 0 {
		return fmt.Errorf("outbox: kafka: metadata_ttl: %s is negative", c.MetadataTTL)
	}
	if err := c.TLS.Validate("kafka", ""); err != nil {
		return err
	}
	return c.SASL.withDefaults().validate(c.TLS.On(false))
}

// validate checks the SASL section; tls says whether TLS is on.
func (a SASLConfig) validate(tls bool) error {
	if a.AWSRegion != "" && a.Mechanism != SASLAWSMSKIAM {
		return errors.New("outbox: kafka: sasl.aws_region: only used with sasl.mechanism aws-msk-iam")
	}
	switch a.Mechanism {
	case "":
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if a.Username == "" {
			return errors.New("outbox: kafka: sasl.username: required with sasl.mechanism " + a.Mechanism)
		}
		if a.Password == "" {
			return errors.New("outbox: kafka: sasl.password: required with sasl.mechanism " + a.Mechanism)
		}
	case SASLAWSMSKIAM:
		if a.Username != "" || a.Password != "" {
			return errors.New("outbox: kafka: sasl.username: not used with sasl.mechanism aws-msk-iam (credentials come from the AWS SDK's default chain; remove the user info or the username and password)")
		}
		if !tls {
			// The signed request is a bearer credential for its 5 minutes;
			// MSK serves IAM authentication only on its TLS listener (9098).
			return errors.New("outbox: kafka: tls.enable: sasl.mechanism aws-msk-iam needs TLS (tls=true; MSK's IAM listener is TLS only, port 9098)")
		}
	default:
		return fmt.Errorf("outbox: kafka: sasl.mechanism: %q is not one of plain, scram-sha-256, scram-sha-512, aws-msk-iam", redact.URL(a.Mechanism))
	}
	return nil
}

// Redacted returns the configuration as a sink URL with the password
// (and anything else redact.URL takes for a credential) replaced by
// "xxxxx", for logs and error messages.
func (c Config) Redacted() string {
	u := url.URL{Scheme: "kafka", Host: strings.Join(c.Brokers, ",")}
	if c.SASL.Username != "" || c.SASL.Password != "" {
		if c.SASL.Password != "" {
			u.User = url.UserPassword(c.SASL.Username, sinkconf.Redacted)
		} else {
			u.User = url.User(c.SASL.Username)
		}
	}
	u.RawQuery = params.Query(&c).Encode()
	// Brokers and options come from the user too: a credential typed
	// in the wrong place is still hidden.
	return redact.URL(u.String())
}

// Target is the identity of c's destination (see sinks.Targeter): the bootstrap brokers, the topic prefix and map, and the
// balancer (which partition a key lands on),
// with the defaults applied; not the tuning, the credentials or TLS.
func (c Config) Target() string {
	c = c.withDefaults()
	return params.Target(&c, "kafka://"+strings.Join(c.Brokers, ","))
}

// Target implements sinks.Targeter (see Config.Target).
func (s *Sink) Target() string { return s.cfg.Target() }

// String redacts, so printing a Config with %v or logging it is safe.
func (c Config) String() string { return c.Redacted() }

// kafkaTopic maps an outbox topic to the Kafka topic it is published to.
func (c Config) kafkaTopic(topic string) string {
	if t, ok := c.TopicMap[topic]; ok {
		return t
	}
	return c.TopicPrefix + topic
}

func (c Config) balancer() kafka.Balancer {
	switch c.Balancer {
	case BalancerCRC32:
		return kafka.CRC32Balancer{}
	case BalancerFNV1a:
		return &kafka.Hash{}
	default:
		return kafka.Murmur2Balancer{}
	}
}

func (c Config) tlsConfig() (*tls.Config, error) {
	return c.TLS.Client("kafka", false, "")
}

// saslMechanism returns the configured mechanism (nil when SASL is off),
// wrapped so that its own failures read as authentication failures.
// aws-msk-iam loads the AWS SDK's configuration: the region and the
// credential chain (credentials are only retrieved when a connection
// authenticates).
func (c Config) saslMechanism() (sasl.Mechanism, error) {
	user, pass := c.SASL.Username, string(c.SASL.Password)
	var m sasl.Mechanism
	switch c.SASL.Mechanism {
	case "":
		return nil, nil
	case SASLPlain:
		m = plain.Mechanism{Username: user, Password: pass}
	case SASLScramSHA256:
		m = scramMechanism{scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()}
	case SASLScramSHA512:
		m = scramMechanism{scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()}
	case SASLAWSMSKIAM:
		ac, err := c.SASL.awsConfig(context.Background())
		if err != nil {
			return nil, err
		}
		m = mskIAMMechanism(ac)
	}
	return authMechanism{m: m, who: c.SASL.who()}, nil
}

// who names the identity in authentication errors: the mechanism and the
// user, never the password.
func (a SASLConfig) who() string {
	if a.Mechanism == SASLAWSMSKIAM {
		return "sasl.mechanism aws-msk-iam"
	}
	return fmt.Sprintf("sasl.mechanism %s, user %q", a.Mechanism, a.Username)
}

// awsConfig loads the AWS SDK's configuration for aws-msk-iam: the
// region from AWSRegion or the SDK's chain, the SDK's default credential
// chain (environment, shared files, web identity such as EKS IRSA, ECS
// and EC2 roles).
func (a SASLConfig) awsConfig(ctx context.Context) (aws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if a.AWSRegion != "" {
		opts = append(opts, awsconfig.WithRegion(a.AWSRegion))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("outbox: kafka: sasl.mechanism aws-msk-iam: loading the AWS SDK configuration: %w", err)
	}
	if ac.Region == "" {
		return aws.Config{}, errors.New("outbox: kafka: sasl.aws_region: required with sasl.mechanism aws-msk-iam: not set, and none in the AWS SDK's chain (AWS_REGION, the shared config file)")
	}
	return ac, nil
}

// mskIAMMechanism signs MSK's AWS_MSK_IAM authentication request with the
// credentials and region of ac.
func mskIAMMechanism(ac aws.Config) sasl.Mechanism {
	return &mskiam.Mechanism{Signer: v4.NewSigner(), Credentials: ac.Credentials, Region: ac.Region}
}

// authMechanism wraps a mechanism so that an error of its own (a SCRAM
// server signature that does not verify, AWS credentials that cannot be
// retrieved) is an *AuthError: the connection failed while
// authenticating, before any request of the sink went out.
type authMechanism struct {
	m   sasl.Mechanism
	who string
}

func (a authMechanism) Name() string { return a.m.Name() }

func (a authMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	sm, first, err := a.m.Start(ctx)
	if err != nil {
		return nil, nil, &AuthError{Who: a.who, Err: err}
	}
	return authSession{sm: sm, who: a.who}, first, nil
}

type authSession struct {
	sm  sasl.StateMachine
	who string
}

func (s authSession) Next(ctx context.Context, challenge []byte) (bool, []byte, error) {
	done, resp, err := s.sm.Next(ctx, challenge)
	if err != nil {
		return false, nil, &AuthError{Who: s.who, Err: err}
	}
	return done, resp, nil
}

// scramMechanism adapts franz-go's SCRAM client to kafka-go's sasl interface.
// kafka-go's own sasl/scram package depends on github.com/xdg-go/scram,
// which this module does not carry; franz-go's implementation uses only the
// standard library and both client state machines have the same shape
// (client-first, client-final, verify server-final).
type scramMechanism struct{ m franzsasl.Mechanism }

func (s scramMechanism) Name() string { return s.m.Name() }

func (s scramMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	host := ""
	if md := sasl.MetadataFromContext(ctx); md != nil {
		host = net.JoinHostPort(md.Host, strconv.Itoa(md.Port))
	}
	sess, first, err := s.m.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	return scramSession{sess}, first, nil
}

type scramSession struct{ s franzsasl.Session }

func (s scramSession) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	return s.s.Challenge(challenge)
}

// validTopicName applies Kafka's topic name rules (1–249 characters of
// [a-zA-Z0-9._-], not "." or ".."); a prefix may be empty.
func validTopicName(name string, prefix bool) error {
	if name == "" {
		if prefix {
			return nil
		}
		return errors.New("empty topic name")
	}
	if len(name) > maxTopicLen {
		return fmt.Errorf("topic name %q is longer than %d characters", redact.URL(name), maxTopicLen)
	}
	if !prefix && (name == "." || name == "..") {
		return fmt.Errorf("topic name %q is not allowed", redact.URL(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || slices.Contains([]rune("._-"), r)) {
			return fmt.Errorf("topic name %q has the character %q (allowed: a-z A-Z 0-9 . _ -)", redact.URL(name), r)
		}
	}
	return nil
}

const maxTopicLen = 249
