package sinkconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS is the TLS material a sink reads from files. Each sink keeps its own
// config fields (their names are user-facing) and copies them here.
type TLS struct {
	CAFile             string // PEM bundle; default the system roots
	CertFile, KeyFile  string // PEM client certificate and key; both or neither
	ServerName         string // name verified in the server's certificate; default the dialed host
	InsecureSkipVerify bool   // for tests only
}

// CheckPair reports a client certificate without its key or the reverse,
// naming the field as "<sink>: tls.cert_file".
func (t TLS) CheckPair(sink string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("outbox: %s: tls.cert_file: cert_file and key_file must be set together", sink)
	}
	return nil
}

// Config reads the files and returns the client configuration (TLS 1.2 at
// least). Errors name the field (tls.ca_file, tls.cert_file) and the file.
func (t TLS) Config(sink string) (*tls.Config, error) {
	if err := t.CheckPair(sink); err != nil {
		return nil, err
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
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
