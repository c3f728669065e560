package cli_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// noAWSFiles keeps the AWS SDK of the command under test away from this
// machine's AWS files and variables; env sets those the test gives.
func noAWSFiles(t *testing.T, env ...string) {
	t.Helper()
	dir := t.TempDir()
	for _, kv := range append([]string{
		"AWS_CONFIG_FILE=" + filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(dir, "credentials"),
		"AWS_PROFILE=", "AWS_REGION=", "AWS_DEFAULT_REGION=", "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SESSION_TOKEN=",
		"AWS_EC2_METADATA_DISABLED=true",
	}, env...) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// The password options are checked before anything connects: one of them
// at most, a password file that reads, IAM authentication over TLS only,
// with a region. Each error names the option and exits 2, whether the
// option came from a flag, the environment or the config file.
func TestDatabasePasswordOptionsChecked(t *testing.T) {
	noAWSFiles(t, "AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=secret")
	t.Setenv("DATABASE_URL", "")
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	missing := filepath.Join(dir, "absent")
	const db = "postgres://relay@127.0.0.1:1/app"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--database-password-file", empty, "--database-password-command", "echo pw"},
			"outbox: database-password-file and database-password-command: each gives the database password; set one of them"},
		{[]string{"--database-password-command", "echo pw", "--database-iam-auth", "aws", "--database-url", db + "?sslmode=require"},
			"database-password-command and database-iam-auth: each gives"},
		{[]string{"--database-password-file", missing}, "outbox: database-password-file: open " + missing + ": no such file or directory"},
		{[]string{"--database-password-file", empty}, "outbox: database-password-file: " + empty + " is empty"},
		{[]string{"--database-password-file", dir}, "is not a regular file"},
		{[]string{"--database-password-command", "  "}, "outbox: database-password-command: empty command"},
		{[]string{"--database-iam-auth", "gcp"}, `outbox: database-iam-auth: "gcp" is not a provider this relay signs in with (aws: AWS RDS and Aurora)`},
		{[]string{"--database-iam-auth", "aws"}, "outbox: database-iam-auth: needs TLS to the database, and the URL's sslmode (prefer or allow, the default being prefer) falls back to plain text"},
		{[]string{"--database-iam-auth", "aws", "--database-url", db + "?sslmode=disable"}, "outbox: database-iam-auth: needs TLS to the database: add sslmode=require"},
	} {
		args := tc.args
		if !strings.Contains(strings.Join(args, " "), "--database-url") {
			args = append(args, "--database-url", db)
		}
		for _, cmd := range [][]string{{"status"}, {"run", "--sink", "stdout", "--admin-addr="}} {
			code, _, stderr := run(t, append(cmd, args...)...)
			require.Equal(t, 2, code, "%v %v: %s", cmd, args, stderr)
			require.Contains(t, stderr, tc.want, "%v %v", cmd, args)
		}
	}

	// The environment and the config file give the same options.
	t.Run("env", func(t *testing.T) {
		t.Setenv("OUTBOX_DATABASE_PASSWORD_FILE", missing)
		code, _, stderr := run(t, "status", "--database-url", db)
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, "outbox: database-password-file: open "+missing)
	})
	t.Run("file", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "relay.yaml")
		require.NoError(t, os.WriteFile(cfg, []byte("database-iam-auth: aws\n"), 0o600))
		noAWSFiles(t) // no region
		code, _, stderr := run(t, "status", "--config", cfg, "--database-url", db+"?sslmode=require")
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, "outbox: database-iam-auth: no AWS region: set AWS_REGION")
	})
}

// The admin commands log in with the password of --database-password-file
// or --database-password-command rather than the URL's, on a server that
// asks for it (a throwaway one).
func TestDatabasePasswordLogsIn(t *testing.T) {
	srv := pgtest.ServerWith(t, pgtest.Options{PasswordAuth: true})
	ctx := context.Background()
	_, err := srv.Pool(t).Exec(ctx, "CREATE ROLE cli_pw LOGIN SUPERUSER PASSWORD 'the-Right-pw'")
	require.NoError(t, err)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("cli_pw", "stale-url-pw") // replaced
	dir := t.TempDir()
	right, wrong := filepath.Join(dir, "right"), filepath.Join(dir, "wrong")
	require.NoError(t, os.WriteFile(right, []byte("the-Right-pw\n"), 0o600))
	require.NoError(t, os.WriteFile(wrong, []byte("the-wrong-pw\n"), 0o600))
	schema := pgtest.SchemaName(t)
	base := []string{"--database-url", u.String(), "--schema", schema}

	code, _, stderr := run(t, append([]string{"migrate", "--database-password-file", right}, base...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "the database URL's password (or PGPASSWORD's, or .pgpass's) is not used: database-password-file gives")
	code, out, stderr := run(t, append([]string{"status", "--database-password-command", "cat '" + right + "'"}, base...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "pending 0")
	code, _, stderr = run(t, append([]string{"status", "--database-password-file", wrong}, base...)...)
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "password authentication failed")
	require.NotContains(t, stderr, "the-wrong-pw")
	code, _, stderr = run(t, append([]string{"status"}, base...)...)
	require.Equal(t, 1, code, "the URL's stale password: %s", stderr)
}

// With --database-iam-auth aws the password a server receives is an RDS
// IAM token for the URL's host, port and user, signed with the AWS SDK's
// credentials and region, over TLS. The server is a stand-in that asks
// for a cleartext password (what RDS does for IAM authentication), keeps
// it, and refuses the login.
func TestDatabaseIAMTokenIsThePassword(t *testing.T) {
	noAWSFiles(t, "AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
	got := cleartextServer(t)
	code, _, stderr := run(t, "status", "--database-iam-auth", "aws",
		"--database-url", fmt.Sprintf("postgres://relay_iam@%s/app?sslmode=require&connect_timeout=10", got.addr))
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "password authentication failed (stand-in)")
	pw, tlsUsed := got.first()
	require.True(t, tlsUsed, "the token went over TLS")
	require.True(t, strings.HasPrefix(pw, got.addr+"?Action=connect&DBUser=relay_iam&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F"), pw)
	require.Contains(t, pw, "%2Feu-west-1%2Frds-db%2Faws4_request&")
	require.Contains(t, pw, "&X-Amz-Expires=900&")
	sig := pw[strings.LastIndex(pw, "X-Amz-Signature=")+len("X-Amz-Signature="):]
	require.Len(t, sig, 64)
	require.NotContains(t, stderr, sig, "the token is not printed")
}

// passwords is what cleartextServer received.
type passwords struct {
	addr string
	mu   sync.Mutex
	pws  []string
	tls  []bool
}

func (p *passwords) first() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pws) == 0 {
		return "", false
	}
	return p.pws[0], p.tls[0]
}

// cleartextServer listens on a loopback port as a PostgreSQL server that
// accepts TLS, asks for a cleartext password, keeps it and refuses the
// login. It stops when the test ends.
func cleartextServer(t *testing.T) *passwords {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cert := selfSigned(t)
	p := &passwords{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c, cert) })
		}
	})
	return p
}

// serve is one connection of cleartextServer.
func (p *passwords) serve(c net.Conn, cert tls.Certificate) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var conn net.Conn = c
	be := pgproto3.NewBackend(conn, conn)
	msg, err := be.ReceiveStartupMessage()
	if err != nil {
		return
	}
	usedTLS := false
	if _, ok := msg.(*pgproto3.SSLRequest); ok {
		if _, err := c.Write([]byte("S")); err != nil {
			return
		}
		conn = tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		be, usedTLS = pgproto3.NewBackend(conn, conn), true
		if msg, err = be.ReceiveStartupMessage(); err != nil {
			return
		}
	}
	if _, ok := msg.(*pgproto3.StartupMessage); !ok {
		return
	}
	be.Send(&pgproto3.AuthenticationCleartextPassword{})
	if be.Flush() != nil {
		return
	}
	if be.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
		return
	}
	m, err := be.Receive()
	if err != nil {
		return
	}
	if pm, ok := m.(*pgproto3.PasswordMessage); ok {
		p.mu.Lock()
		p.pws, p.tls = append(p.pws, pm.Password), append(p.tls, usedTLS)
		p.mu.Unlock()
	}
	be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "password authentication failed (stand-in)"})
	_ = be.Flush()
}

// selfSigned makes a certificate for 127.0.0.1 (sslmode=require does not
// verify it).
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stand-in"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
