package kafkasink

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// selfSigned returns a server certificate for 127.0.0.1 and the path of a PEM
// file holding it (it is its own CA).
func selfSigned(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kfake"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path
}

func TestTLS(t *testing.T) {
	t.Parallel()
	cert, caFile := selfSigned(t)
	c := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), kfake.SeedTopics(1, "t"))
	s := newSink(t, c, func(cfg *Config) { cfg.TLS = TLSConfig{Enable: true, CAFile: caFile} })
	require.NoError(t, s.Healthy(context.Background()))
	require.NoError(t, s.Send(context.Background(), []sinks.Message{msg("t", "k", 1, "over tls")}))

	// Any TLS option turns TLS on, as in every sink: no tls=true needed.
	implied := newSink(t, c, func(cfg *Config) { cfg.TLS = TLSConfig{CAFile: caFile} })
	require.NoError(t, implied.Send(context.Background(), []sinks.Message{msg("t", "k", 2, "over tls, implied")}))

	// Without the CA the broker's certificate is not trusted.
	untrusted := newSink(t, c, func(cfg *Config) { cfg.TLS = TLSConfig{Enable: true}; cfg.DialTimeout = 2 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.Error(t, untrusted.Healthy(ctx))

	_, err := New(Config{Brokers: c.ListenAddrs(), TLS: TLSConfig{Enable: true, CAFile: filepath.Join(t.TempDir(), "missing.pem")}}, nil)
	require.ErrorContains(t, err, "tls.ca_file")
}
