package kafkasink

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/internal/testcert"
)

func TestTLS(t *testing.T) {
	t.Parallel()
	pair := testcert.New(t)
	cert, caFile := pair.Cert, pair.CertFile
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
