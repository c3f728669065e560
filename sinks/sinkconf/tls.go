package sinkconf

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS is the TLS section of every sink that dials a broker (Kafka,
// RabbitMQ, NATS, Redis): the field TLS of the sink's Config, set in a
// file under tls: and in a sink URL by the parameters TLSParams declares. It behaves the same in every sink
// (docs/security.md, "TLS to the sinks"):
//
//   - TLS is on when the URL's scheme asks for it (amqps://, rediss://),
//     when Enable is set, or when any other field is set.
//   - A URL scheme that asks for plaintext where the sink has a TLS scheme
//     (amqp://, redis://) with any field set is an error: use the TLS
//     scheme.
//   - The connection verifies the server's certificate against the system
//     roots (or CAFile) for the host dialed (or ServerName), and offers
//     TLS 1.2 at least.
type TLS struct {
	// Enable turns TLS on with the defaults below; setting any other field
	// turns it on too. Default: false (TLS only if the URL's scheme asks
	// for it).
	Enable bool `yaml:"enable"`
	// CAFile is a PEM bundle of the CAs trusted for the server's
	// certificate. Default: the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile is a PEM client certificate, for mutual TLS (or RabbitMQ's
	// EXTERNAL authentication). Set it together with KeyFile.
	// Default: none.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key of CertFile. Default: none.
	KeyFile string `yaml:"key_file"`
	// ServerName is the name verified in the server's certificate.
	// Default: the host dialed.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables verification of the server's
	// certificate. For tests only. Default: false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// IsZero reports whether no field is set.
func (t TLS) IsZero() bool { return t == TLS{} }

// On reports whether TLS is on; scheme says whether the URL's scheme asks
// for TLS (amqps, rediss).
func (t TLS) On(scheme bool) bool { return scheme || !t.IsZero() }

// Validate reports the first problem, naming the field ("outbox: <sink>:
// tls.cert_file: ..."). plain is the URL's scheme when it asks for
// plaintext and the sink has a TLS scheme besides ("amqp", "redis"), else
// "". It reads no file: Client does.
func (t TLS) Validate(sink, plain string) error {
	if plain != "" && !t.IsZero() {
		return fmt.Errorf("outbox: %s: tls: set, but the url scheme is %s; use %ss://", sink, plain, plain)
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("outbox: %s: tls.cert_file: cert_file and key_file must be set together", sink)
	}
	return nil
}

// Client returns the client configuration, or nil when TLS is off (see
// On; scheme says whether the URL's scheme asks for TLS). host is the
// server name to verify when ServerName is empty: the one host the sink
// dials, or "" to leave it to the client library, which verifies each
// server it dials under that server's host. Client reads the files; its
// errors name the field (tls.ca_file, tls.cert_file) and the file.
func (t TLS) Client(sink string, scheme bool, host string) (*tls.Config, error) {
	if !t.On(scheme) {
		return nil, nil
	}
	if err := t.Validate(sink, ""); err != nil {
		return nil, err
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         cmp.Or(t.ServerName, host),
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as test-only
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: %s: tls.ca_file: %w", sink, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("outbox: %s: tls.ca_file: no PEM certificate in %s", sink, t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("outbox: %s: tls.cert_file: %w", sink, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// TLSParams are the URL query parameters of a sink's TLS section, under
// the names every sink takes: tls (Enable), tls_ca_file, tls_cert_file,
// tls_key_file, tls_server_name and tls_insecure_skip_verify. field
// returns the section of a config.
func TLSParams[C any](field func(c *C) *TLS) []Param[C] {
	return []Param[C]{
		Bool("tls", func(c *C) *bool { return &field(c).Enable }),
		String("tls_ca_file", func(c *C) *string { return &field(c).CAFile }),
		String("tls_cert_file", func(c *C) *string { return &field(c).CertFile }),
		String("tls_key_file", func(c *C) *string { return &field(c).KeyFile }),
		String("tls_server_name", func(c *C) *string { return &field(c).ServerName }),
		Bool("tls_insecure_skip_verify", func(c *C) *bool { return &field(c).InsecureSkipVerify }),
	}
}
