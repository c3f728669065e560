package sinkconf_test

import (
	"crypto/tls"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks/internal/testcert"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
)

// pemFiles writes a self-signed certificate and its key, and returns the
// paths of both and of a file that holds no certificate.
func pemFiles(t *testing.T) (cert, key, junk string) {
	t.Helper()
	p := testcert.New(t)
	junk = filepath.Join(t.TempDir(), "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("not a certificate\n"), 0o600))
	return p.CertFile, p.KeyFile, junk
}

func TestTLSClient(t *testing.T) {
	t.Parallel()
	cert, key, junk := pemFiles(t)
	for _, tc := range []struct {
		name   string
		tls    sinkconf.TLS
		scheme bool   // the URL's scheme asks for TLS
		host   string // the sink's default server name
		// check inspects the result; nil means TLS stays off.
		check   func(t *testing.T, c *tls.Config)
		wantErr string
	}{
		{name: "off", tls: sinkconf.TLS{}},
		{name: "scheme turns it on", scheme: true, host: "broker", check: func(t *testing.T, c *tls.Config) {
			require.Equal(t, uint16(tls.VersionTLS12), c.MinVersion)
			require.Equal(t, "broker", c.ServerName, "the host dialed")
			require.Nil(t, c.RootCAs, "system roots")
			require.Empty(t, c.Certificates)
			require.False(t, c.InsecureSkipVerify)
		}},
		{name: "enable", tls: sinkconf.TLS{Enable: true}, check: func(t *testing.T, c *tls.Config) {
			require.Empty(t, c.ServerName, "left to the client library")
		}},
		{name: "ca_file turns it on", tls: sinkconf.TLS{CAFile: cert}, check: func(t *testing.T, c *tls.Config) {
			require.NotNil(t, c.RootCAs)
		}},
		{name: "client certificate", tls: sinkconf.TLS{CertFile: cert, KeyFile: key}, check: func(t *testing.T, c *tls.Config) {
			require.Len(t, c.Certificates, 1)
		}},
		{name: "server_name wins over the host", tls: sinkconf.TLS{ServerName: "name"}, host: "broker", check: func(t *testing.T, c *tls.Config) {
			require.Equal(t, "name", c.ServerName)
		}},
		{name: "insecure_skip_verify", tls: sinkconf.TLS{InsecureSkipVerify: true}, check: func(t *testing.T, c *tls.Config) {
			require.True(t, c.InsecureSkipVerify)
		}},
		{name: "cert without key", tls: sinkconf.TLS{CertFile: cert}, wantErr: "outbox: test: tls.cert_file: cert_file and key_file must be set together"},
		{name: "key without cert", tls: sinkconf.TLS{KeyFile: key}, wantErr: "outbox: test: tls.cert_file: cert_file and key_file must be set together"},
		{name: "missing ca_file", tls: sinkconf.TLS{CAFile: "/nonexistent/ca.pem"}, wantErr: "outbox: test: tls.ca_file: open /nonexistent/ca.pem"},
		{name: "ca_file without a certificate", tls: sinkconf.TLS{CAFile: junk}, wantErr: "outbox: test: tls.ca_file: no PEM certificate in " + junk},
		{name: "unreadable key pair", tls: sinkconf.TLS{CertFile: cert, KeyFile: junk}, wantErr: "outbox: test: tls.cert_file: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := tc.tls.Client("test", tc.scheme, tc.host)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.check != nil, c != nil, "TLS on")
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestTLSValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		tls     sinkconf.TLS
		plain   string
		wantErr string
	}{
		{name: "empty with a plaintext scheme", plain: "amqp"},
		{name: "set without a scheme of its own", tls: sinkconf.TLS{CAFile: "/ca.pem"}},
		{name: "set with a plaintext scheme", tls: sinkconf.TLS{CAFile: "/ca.pem"}, plain: "redis", wantErr: "outbox: test: tls: set, but the url scheme is redis; use rediss://"},
		{name: "enable with a plaintext scheme", tls: sinkconf.TLS{Enable: true}, plain: "amqp", wantErr: "outbox: test: tls: set, but the url scheme is amqp; use amqps://"},
		{name: "half a pair", tls: sinkconf.TLS{KeyFile: "/k.pem"}, wantErr: "outbox: test: tls.cert_file: cert_file and key_file must be set together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.tls.Validate("test", tc.plain)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.wantErr)
		})
	}
}

type tlsConf struct{ TLS sinkconf.TLS }

func TestTLSParams(t *testing.T) {
	t.Parallel()
	p := sinkconf.NewParams[tlsConf]("test", "").With(sinkconf.TLSParams(func(c *tlsConf) *sinkconf.TLS { return &c.TLS })...)
	require.Equal(t, []string{"tls", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name", "tls_insecure_skip_verify"}, p.Names())
	var c tlsConf
	require.NoError(t, p.Parse(&c, "tls=true&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem&tls_server_name=b&tls_insecure_skip_verify=1"))
	require.Equal(t, sinkconf.TLS{Enable: true, CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem", ServerName: "b", InsecureSkipVerify: true}, c.TLS)
	require.Equal(t, url.Values{"tls": {"true"}, "tls_ca_file": {"/ca.pem"}, "tls_cert_file": {"/c.pem"},
		"tls_key_file": {"/k.pem"}, "tls_server_name": {"b"}, "tls_insecure_skip_verify": {"true"}}, p.Query(&c))
}
