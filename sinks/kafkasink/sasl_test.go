package kafkasink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	mskiam "github.com/segmentio/kafka-go/sasl/aws_msk_iam_v2"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/testcert"
)

// A current broker answers bad credentials with SASL_AUTHENTICATION_FAILED
// and a message (kfake closes the connection instead, see TestSASL): the
// sink reports an *AuthError naming the mechanism and user, and the
// messages as not attempted.
func TestSASLRefusedWithCode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "s3cret"), kfake.SeedTopics(1, "t"))
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := kreq.(*kmsg.SASLAuthenticateRequest).ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = int16(kafka.SASLAuthenticationFailed)
		msg := "Authentication failed: Invalid username or password"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
	s := newSink(t, c, func(cfg *Config) {
		cfg.SASL = SASLConfig{Mechanism: SASLPlain, Username: "relay", Password: "rotated-away"}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.Send(ctx, []sinks.Message{msg("t", "a", 1, "x"), msg("t", "b", 2, "y")})
	for i := range 2 {
		e := outcome(err, i, 2)
		require.ErrorIs(t, e, sinks.ErrNotAttempted, "bad credentials spend no attempt")
		require.ErrorIs(t, e, kafka.SASLAuthenticationFailed)
		var ae *AuthError
		require.ErrorAs(t, e, &ae)
		require.Equal(t, `sasl.mechanism plain, user "relay"`, ae.Who)
		require.False(t, sinks.IsPermanent(e))
	}
	require.ErrorContains(t, err, `SASL authentication failed (sasl.mechanism plain, user "relay"; check the sasl settings)`)
	require.ErrorContains(t, err, "Invalid username or password")
	require.NotContains(t, err.Error(), "rotated-away")

	herr := s.Healthy(ctx)
	var ae *AuthError
	require.ErrorAs(t, herr, &ae)
	require.NotContains(t, herr.Error(), "rotated-away")
}

// SASL over TLS, the setting of every managed Kafka: SCRAM-SHA-512 inside
// a TLS connection, records read back by an independent client.
func TestSASLOverTLS(t *testing.T) {
	t.Parallel()
	pair := testcert.New(t)
	c := newCluster(t,
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair.Cert}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "relay", "s3cret"), kfake.SeedTopics(1, "t"))
	s := newSink(t, c, func(cfg *Config) {
		cfg.TLS = TLSConfig{CAFile: pair.CertFile}
		cfg.SASL = SASLConfig{Mechanism: SASLScramSHA512, Username: "relay", Password: "s3cret"}
	})
	require.NoError(t, s.Healthy(context.Background()))
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "over tls, authenticated")}))

	pem, err := os.ReadFile(pair.CertFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	cons := newConsumerWith(t, c.ListenAddrs(), []kgo.Opt{
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: "relay", Pass: "s3cret"}.AsSha512Mechanism()),
	}, "t")
	recs := cons.mustRead(t, 1)
	require.Equal(t, "over tls, authenticated", string(recs[0].Value))
}

// staticAWS is an AWS configuration with fixed credentials, as the SDK's
// chain would return them.
func staticAWS(region string) aws.Config {
	return aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token")}
}

// The aws-msk-iam mechanism signs MSK's authentication request with the
// SDK's credentials for the broker's host and the region. What MSK then
// does with the signature is not testable here (no local MSK): the
// payload is checked for the fields and the credential scope MSK
// verifies.
func TestMSKIAMSignsTheAuthenticationRequest(t *testing.T) {
	t.Parallel()
	m := authMechanism{m: mskIAMMechanism(staticAWS("eu-west-1")), who: "sasl.mechanism aws-msk-iam"}
	require.Equal(t, "AWS_MSK_IAM", m.Name())
	ctx := sasl.WithMetadata(context.Background(), &sasl.Metadata{Host: "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com", Port: 9098})
	sm, first, err := m.Start(ctx)
	require.NoError(t, err)
	var payload map[string]string
	require.NoError(t, json.Unmarshal(first, &payload))
	require.Equal(t, "2020_10_22", payload["version"])
	require.Equal(t, "kafka-cluster:Connect", payload["action"])
	require.Equal(t, "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com", payload["host"])
	require.Equal(t, "AWS4-HMAC-SHA256", payload["x-amz-algorithm"])
	require.Regexp(t, `^AKIDEXAMPLE/\d{8}/eu-west-1/kafka-cluster/aws4_request$`, payload["x-amz-credential"])
	require.Equal(t, "session-token", payload["x-amz-security-token"])
	require.Equal(t, "host", payload["x-amz-signedheaders"])
	require.Regexp(t, `^[0-9a-f]{64}$`, payload["x-amz-signature"])
	require.NotContains(t, string(first), "wJalrXUtnFEMI", "the secret key signs, it is never sent")
	done, _, err := sm.Next(ctx, nil)
	require.NoError(t, err)
	require.True(t, done, "MSK answers once: the exchange is one round trip")

	// Credentials that cannot be retrieved fail the connection as an
	// authentication problem.
	broken := aws.Config{Region: "eu-west-1", Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{}, errors.New("no EC2 role")
	})}
	_, _, err = authMechanism{m: mskIAMMechanism(broken), who: "sasl.mechanism aws-msk-iam"}.Start(ctx)
	var ae *AuthError
	require.ErrorAs(t, err, &ae)
	require.ErrorContains(t, err, "no EC2 role")
}

// A sink configured for aws-msk-iam offers AWS_MSK_IAM in the SASL
// handshake, over TLS; kfake does not offer it and says so, which the
// sink reports as an authentication problem that spends no attempt.
func TestMSKIAMHandshake(t *testing.T) {
	t.Parallel()
	pair := testcert.New(t)
	c := newCluster(t,
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair.Cert}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "admin", "admin"), kfake.SeedTopics(1, "t"))
	s := newSink(t, c, func(cfg *Config) {
		cfg.TLS = TLSConfig{CAFile: pair.CertFile}
		cfg.SASL = SASLConfig{Mechanism: SASLAWSMSKIAM, AWSRegion: "eu-west-1"}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.Send(ctx, []sinks.Message{msg("t", "k", 1, "x")})
	require.ErrorIs(t, outcome(err, 0, 1), sinks.ErrNotAttempted)
	require.ErrorIs(t, err, kafka.UnsupportedSASLMechanism)
	require.ErrorContains(t, err, "SASL authentication failed (sasl.mechanism aws-msk-iam; check the sasl settings)")
}

// Without sasl.aws_region and with no region in the AWS SDK's chain, New
// refuses aws-msk-iam naming the field. Not parallel: it empties the
// SDK's environment.
func TestMSKIAMNeedsRegion(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	cfg := Config{Brokers: []string{"b-1.msk.example:9098"}, TLS: TLSConfig{Enable: true}, SASL: SASLConfig{Mechanism: SASLAWSMSKIAM}}
	_, err := New(cfg, nil)
	require.ErrorContains(t, err, "outbox: kafka: sasl.aws_region: required with sasl.mechanism aws-msk-iam")

	t.Setenv("AWS_REGION", "eu-central-1")
	s, err := New(cfg, nil)
	require.NoError(t, err, "the region comes from the SDK's chain")
	require.Equal(t, "eu-central-1", s.sasl.(authMechanism).m.(*mskiam.Mechanism).Region)
	require.True(t, strings.HasPrefix(cfg.Redacted(), "kafka://b-1.msk.example:9098?"))
	require.NoError(t, s.Close(t.Context()))
}
