package awsbatch

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/outbox-relay/outbox-relay/internal/redact"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// Options are the options both sinks take, as Fields of their own Config
// (the field names and docs stay in each sink's Config).
type Options struct {
	Region, Endpoint, AccessKeyID string
	SecretAccessKey               sinkconf.Secret
	BodyEncoding                  string
	MaxMessageBytes, Concurrency  int
	PublishTimeout                time.Duration
}

// Fields points at the Options fields of a sink's Config.
type Fields struct {
	Region, Endpoint, AccessKeyID *string
	SecretAccessKey               *sinkconf.Secret
	BodyEncoding                  *string
	MaxMessageBytes, Concurrency  *int
	PublishTimeout                *time.Duration
}

// Options returns the values f points at.
func (f Fields) Options() Options {
	return Options{Region: *f.Region, Endpoint: *f.Endpoint, AccessKeyID: *f.AccessKeyID, SecretAccessKey: *f.SecretAccessKey,
		BodyEncoding: *f.BodyEncoding, MaxMessageBytes: *f.MaxMessageBytes, Concurrency: *f.Concurrency, PublishTimeout: *f.PublishTimeout}
}

// Validate reports the first problem in o, naming the field; sink names
// the sink in errors ("sqs"), largest is the service's largest message.
// Errors never contain the secret key.
func (o Options) Validate(sink string, largest int) error {
	if o.Endpoint != "" {
		u, err := url.Parse(o.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("outbox: %s: endpoint: want http(s)://host[:port], got %q", sink, redact.URL(o.Endpoint))
		}
	}
	if (o.AccessKeyID == "") != (o.SecretAccessKey == "") {
		return fmt.Errorf("outbox: %s: access_key_id: access_key_id and secret_access_key must be set together", sink)
	}
	switch o.BodyEncoding {
	case "", "text", "base64":
	default:
		return fmt.Errorf(`outbox: %s: body_encoding: want "text" or "base64", got %q`, sink, o.BodyEncoding)
	}
	if o.MaxMessageBytes < 0 || o.MaxMessageBytes > largest || o.MaxMessageBytes != 0 && o.MaxMessageBytes < 1024 {
		return fmt.Errorf("outbox: %s: max_message_bytes: must be between 1024 and %d, got %d", sink, largest, o.MaxMessageBytes)
	}
	if o.Concurrency < 0 {
		return fmt.Errorf("outbox: %s: concurrency: must not be negative, got %d", sink, o.Concurrency)
	}
	if o.PublishTimeout < 0 {
		return fmt.Errorf("outbox: %s: publish_timeout: must not be negative, got %s", sink, o.PublishTimeout)
	}
	return nil
}

// Start is how each sink's New begins once its Config is validated and
// defaulted: it parses dest, the destination template of the field named
// field ("queue_url"), and returns it with logger (one that discards when
// nil) naming the sink.
func Start(sink, field, dest string, logger *slog.Logger) (sinkconf.Template, *slog.Logger, error) {
	t, err := sinkconf.ParseTemplate(dest)
	if err != nil {
		return sinkconf.Template{}, nil, fmt.Errorf("outbox: %s: %s: %w", sink, field, err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return t, logger.With("sink", sink), nil
}

// AWSConfig loads the SDK's configuration for a client: the SDK's default
// chain for the region and credentials unless o sets them, and no SDK
// retries (the relay retries, with backoff kept in the row).
func (o Options) AWSConfig(ctx context.Context, sink string) (aws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	if o.AccessKeyID != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(o.AccessKeyID, string(o.SecretAccessKey), "")))
	}
	opts = append(opts, awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }))
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("outbox: %s: loading the AWS SDK configuration: %w", sink, err)
	}
	if ac.Region == "" {
		return aws.Config{}, fmt.Errorf("outbox: %s: region: not set, and none in the SDK's chain (AWS_REGION, the shared config file)", sink)
	}
	return ac, nil
}

// Params are the URL query parameters of Options, under their yaml names;
// region, endpoint and body_encoding are part of a sink's Target (see
// sinkconf.Routing).
func Params[C any](f func(c *C) Fields) []sinkconf.Param[C] {
	return []sinkconf.Param[C]{
		sinkconf.Routing(sinkconf.String("region", func(c *C) *string { return f(c).Region })),
		sinkconf.Routing(sinkconf.String("endpoint", func(c *C) *string { return f(c).Endpoint })),
		sinkconf.String("access_key_id", func(c *C) *string { return f(c).AccessKeyID }),
		sinkconf.Func("secret_access_key",
			func(c *C, v string) error { *f(c).SecretAccessKey = sinkconf.Secret(v); return nil },
			func(c *C) string { return f(c).SecretAccessKey.String() }),
		sinkconf.Routing(sinkconf.String("body_encoding", func(c *C) *string { return f(c).BodyEncoding })),
		sinkconf.Int("max_message_bytes", func(c *C) *int { return f(c).MaxMessageBytes }),
		sinkconf.Int("concurrency", func(c *C) *int { return f(c).Concurrency }),
		sinkconf.Duration("publish_timeout", func(c *C) *time.Duration { return f(c).PublishTimeout }),
	}
}

// CheckBase reports a sink URL with a host or path: base is the URL
// without its query. The destination (what, "the queue URL") is the
// parameter dest, a template, not part of the URL.
func CheckBase(sink, base, dest, what string) error {
	if rest := strings.TrimPrefix(strings.TrimPrefix(base, sink+":"), "//"); rest != "" {
		return fmt.Errorf("outbox: %s: url: want %s://?%s=..., got a host or path %q (%s is the %s parameter)", sink, sink, dest, redact.URL(rest), what, dest)
	}
	return nil
}
