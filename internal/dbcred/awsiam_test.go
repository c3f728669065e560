package dbcred

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// countingCreds is a static credentials provider that counts how often
// it is asked: BuildAuthToken asks once per token it builds.
type countingCreds struct {
	creds aws.Credentials
	asked atomic.Int32
}

func (c *countingCreds) Retrieve(context.Context) (aws.Credentials, error) {
	c.asked.Add(1)
	return c.creds, nil
}

var testCreds = aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", Source: "test"}

func parseConfig(t *testing.T, dsn string) *pgconn.Config {
	t.Helper()
	cc, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	return cc
}

// rdsIAM is RDSIAM on the fake clock c with creds.
func rdsIAM(t *testing.T, dsn string, creds aws.CredentialsProvider, c *clock) *Source {
	t.Helper()
	s, err := RDSIAM(parseConfig(t, dsn), aws.Config{Region: "eu-west-1", Credentials: creds})
	require.NoError(t, err)
	s.now = c.now
	return s
}

// The token is the presigned URL RDS takes as the password, without its
// scheme: host:port?Action=connect&DBUser=...&X-Amz-..., signed (SigV4, service
// rds-db) for the URL's host, port and user with the configured region
// and credentials, valid 900 seconds.
func TestRDSIAMToken(t *testing.T) {
	t.Parallel()
	creds := &countingCreds{creds: testCreds}
	s := rdsIAM(t, "postgres://relay_user@db-1.abcdefghijkl.eu-west-1.rds.amazonaws.com:5433/app?sslmode=verify-full", creds, newClock())
	token := password(t, s)
	require.True(t, strings.HasPrefix(token, "db-1.abcdefghijkl.eu-west-1.rds.amazonaws.com:5433?Action=connect&DBUser=relay_user&X-Amz-Algorithm=AWS4-HMAC-SHA256&"), token)
	u, err := url.Parse("https://" + token)
	require.NoError(t, err)
	q := u.Query()
	signedAt, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	require.NoError(t, err, "X-Amz-Date")
	require.WithinDuration(t, time.Now(), signedAt, time.Minute, "signed now")
	require.Equal(t, "AKIDEXAMPLE/"+signedAt.Format("20060102")+"/eu-west-1/rds-db/aws4_request", q.Get("X-Amz-Credential"))
	require.Equal(t, "900", q.Get("X-Amz-Expires"), "RDS tokens are valid 15 minutes")
	require.Equal(t, "host", q.Get("X-Amz-SignedHeaders"))
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}$`), q.Get("X-Amz-Signature"))
	require.Empty(t, q.Get("X-Amz-Security-Token"), "long-term credentials carry no session token")

	// The signature is SigV4's for that request, time and key: signed
	// again here with the signer of the AWS SDK, it is the same.
	req, err := http.NewRequest(http.MethodGet, "https://db-1.abcdefghijkl.eu-west-1.rds.amazonaws.com:5433?Action=connect&DBUser=relay_user&X-Amz-Expires=900", nil)
	require.NoError(t, err)
	const emptyPayload = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	want, _, err := v4.NewSigner().PresignHTTP(context.Background(), testCreds, req, emptyPayload, "rds-db", "eu-west-1", signedAt)
	require.NoError(t, err)
	require.Equal(t, strings.TrimPrefix(want, "https://"), token)

	// Temporary credentials: the session token travels in the token.
	session := &countingCreds{creds: aws.Credentials{AccessKeyID: "ASIAEXAMPLE", SecretAccessKey: "secret", SessionToken: "session/token+1",
		CanExpire: true, Expires: time.Now().Add(time.Hour)}}
	u, err = url.Parse("https://" + password(t, rdsIAM(t, "postgres://relay_user@db:5432/app?sslmode=require", session, newClock())))
	require.NoError(t, err)
	require.Equal(t, "session/token+1", u.Query().Get("X-Amz-Security-Token"))
}

// A token is built once for the connections opened together and reused
// for IAMTokenReuse, then built again: not per connection, and never
// past the end of the credentials that signed it.
func TestRDSIAMTokenReuse(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://relay_user@db.example.internal:5432/app?sslmode=require"
	creds := &countingCreds{creds: testCreds}
	c := newClock()
	s := rdsIAM(t, dsn, creds, c)
	tokens := concurrently(t, s, 7)
	require.Equal(t, int32(1), creds.asked.Load(), "7 connections opened together built more than one token")
	for _, tok := range tokens {
		require.Equal(t, tokens[0], tok)
	}
	c.add(IAMTokenReuse - time.Second)
	require.Equal(t, tokens[0], password(t, s))
	require.Equal(t, int32(1), creds.asked.Load(), "a token built again before IAMTokenReuse")
	c.add(time.Second)
	password(t, s)
	require.Equal(t, int32(2), creds.asked.Load(), "the token is built again once IAMTokenReuse has passed")
	require.Less(t, IAMTokenReuse, 15*time.Minute, "reused past RDS' 15 minutes")

	// Credentials that expire in 2 minutes (an assumed role's session)
	// bound the token's reuse to them.
	c = newClock()
	short := &countingCreds{creds: aws.Credentials{AccessKeyID: "ASIAEXAMPLE", SecretAccessKey: "secret", SessionToken: "tok",
		CanExpire: true, Expires: c.now().Add(2 * time.Minute)}}
	s = rdsIAM(t, dsn, short, c)
	password(t, s)
	c.add(2*time.Minute - time.Second)
	password(t, s)
	require.Equal(t, int32(1), short.asked.Load())
	c.add(time.Second)
	password(t, s)
	require.Equal(t, int32(2), short.asked.Load(), "a token outlived the credentials that signed it")
}

// IAM authentication is refused, naming database-iam-auth, where a token
// could travel in plain text or be signed for the wrong host, and without
// a region.
func TestRDSIAMRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn, want string
	}{
		{"postgres://u@db:5432/app?sslmode=disable", "needs TLS to the database: add sslmode=require"},
		{"postgres://u@db:5432/app", "falls back to plain text"}, // pgx's default: prefer
		{"postgres://u@db:5432/app?sslmode=prefer", "falls back to plain text"},
		{"postgres://u@db:5432/app?sslmode=allow", "needs TLS to the database"},
		{"postgres://u@db1:5432,db2:5432/app?sslmode=require", "names several hosts"},
		{"host=/var/run/postgresql user=u dbname=app sslmode=require", "a Unix socket takes no IAM token"},
	} {
		_, err := RDSIAM(parseConfig(t, tc.dsn), aws.Config{Region: "eu-west-1", Credentials: &countingCreds{creds: testCreds}})
		require.Error(t, err, tc.dsn)
		require.Contains(t, err.Error(), "database-iam-auth: ", tc.dsn)
		require.Contains(t, err.Error(), tc.want, tc.dsn)
	}
	_, err := RDSIAM(parseConfig(t, "postgres://u@db:5432/app?sslmode=require"), aws.Config{Credentials: &countingCreds{creds: testCreds}})
	require.ErrorContains(t, err, "database-iam-auth: no AWS region: set AWS_REGION")
}
