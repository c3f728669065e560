package dbcred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5/pgconn"
)

// IAMTokenReuse is how long RDSIAM reuses a token. RDS accepts a token
// for 15 minutes after it was signed (and only for new connections: one
// open keeps working after); reused for 10, the last connection that
// takes it still has 5 minutes of margin for a slow connection and a
// clock that is off.
const IAMTokenReuse = 10 * time.Minute

// RDSIAM gives AWS RDS and Aurora IAM authentication tokens for the
// database cc connects to: its host, port and user, signed with awsCfg's
// credentials in awsCfg's region (github.com/aws/aws-sdk-go-v2/feature/rds/auth).
// A token is built when a connection needs one and the last is older than
// IAMTokenReuse, or its credentials expired (temporary credentials end
// the validity of what they signed). cc must use TLS without a plain-text
// fallback (sslmode=require, verify-ca or verify-full: RDS takes IAM
// tokens only over TLS, and a token sent in the clear can be replayed for
// its 15 minutes) and name one host. Errors name database-iam-auth.
func RDSIAM(cc *pgconn.Config, awsCfg aws.Config) (*Source, error) {
	endpoint, err := iamEndpoint(cc)
	if err != nil {
		return nil, err
	}
	switch {
	case awsCfg.Region == "":
		return nil, errors.New("database-iam-auth: no AWS region: set AWS_REGION, or a region in the profile of the AWS config file")
	case awsCfg.Credentials == nil:
		return nil, errors.New("database-iam-auth: no AWS credentials provider")
	case cc.User == "":
		return nil, errors.New("database-iam-auth: the database URL names no user (the database user the IAM policy's rds-db:connect allows)")
	}
	region, user, creds := awsCfg.Region, cc.User, awsCfg.Credentials
	return newSource(func(ctx context.Context, now time.Time) (string, time.Time, error) {
		// BuildAuthToken retrieves the credentials it signs with: seen on
		// the way, their expiry bounds the token's reuse.
		var used aws.Credentials
		seen := aws.CredentialsProviderFunc(func(ctx context.Context) (aws.Credentials, error) {
			c, err := creds.Retrieve(ctx)
			used = c
			return c, err
		})
		token, err := auth.BuildAuthToken(ctx, endpoint, region, user, seen)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("database-iam-auth: build the RDS IAM token for %s: %w", endpoint, err)
		}
		until := now.Add(IAMTokenReuse)
		if used.CanExpire && used.Expires.Before(until) {
			until = used.Expires
		}
		return token, until, nil
	}), nil
}

// iamEndpoint returns the host:port a token is signed for, refusing a
// configuration that could send it without TLS or to another host.
func iamEndpoint(cc *pgconn.Config) (string, error) {
	if cc.Host == "" || strings.HasPrefix(cc.Host, "/") {
		return "", errors.New("database-iam-auth: needs the database's host name (a Unix socket takes no IAM token)")
	}
	if cc.TLSConfig == nil {
		return "", errors.New("database-iam-auth: needs TLS to the database: add sslmode=require (or verify-ca, verify-full) to the database URL")
	}
	for _, fb := range cc.Fallbacks {
		if fb.TLSConfig == nil {
			return "", errors.New("database-iam-auth: needs TLS to the database, and the URL's sslmode (prefer or allow, the default being prefer) falls back to plain text: set sslmode=require (or verify-ca, verify-full)")
		}
		if fb.Host != cc.Host || fb.Port != cc.Port {
			return "", errors.New("database-iam-auth: the database URL names several hosts, and a token is signed for one: give the one endpoint (the cluster's writer endpoint for Aurora)")
		}
	}
	return net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), nil
}
