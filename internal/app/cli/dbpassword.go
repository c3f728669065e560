package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/dbcred"
)

// The options that give the database password of each new connection,
// instead of the database URL's (docs/security.md, "Database
// credentials that rotate").
const (
	optPasswordFile    = "database-password-file"
	optPasswordCommand = "database-password-command"
	optIAMAuth         = "database-iam-auth"
	// iamAWS is --database-iam-auth's one value: AWS RDS and Aurora.
	iamAWS = "aws"
)

// databasePassword returns the password source the database options
// choose for the database at url, checked, and the option that chose it; nil and "" when none
// is set (the URL's password, PGPASSWORD or .pgpass, as pgx finds them).
// A password file is read once here, so that a wrong path or an empty
// file is a usage error at start, not a connection failure later.
func (g *globals) databasePassword(ctx context.Context, url string) (func(context.Context) (string, error), string, error) {
	var set []string
	for _, o := range []struct{ name, value string }{{optPasswordFile, g.passwordFile}, {optPasswordCommand, g.passwordCommand}, {optIAMAuth, g.iamAuth}} {
		if o.value != "" {
			set = append(set, o.name)
		}
	}
	if len(set) == 0 {
		return nil, "", nil
	}
	if len(set) > 1 {
		return nil, "", usagef("outbox: %s: each gives the database password; set one of them", strings.Join(set, " and "))
	}
	cc, err := pgconn.ParseConfig(url) // requireDatabase, or the sources list's check, parsed it already
	if err != nil {
		return nil, "", usagef("outbox: database-url: cannot parse %s", redactURL(url))
	}
	var src *dbcred.Source
	switch {
	case g.passwordFile != "":
		if _, err := dbcred.ReadFile(g.passwordFile); err != nil {
			return nil, "", usagef("outbox: %v", err)
		}
		if fi, err := os.Stat(g.passwordFile); err == nil && exposed(fi) {
			g.log.Warn("the database password file is readable by other users; make it 0400 or 0600 (in Kubernetes, where the file belongs to root: defaultMode 0440 and the pod's fsGroup)",
				"option", optPasswordFile, "path", g.passwordFile, "mode", fi.Mode().Perm().String())
		}
		src = dbcred.File(g.passwordFile)
	case g.passwordCommand != "":
		if strings.TrimSpace(g.passwordCommand) == "" {
			return nil, "", usagef("outbox: %s: empty command", optPasswordCommand)
		}
		src = dbcred.Command(g.passwordCommand)
	case g.iamAuth != iamAWS:
		return nil, "", usagef("outbox: %s: %q is not a provider this relay signs in with (aws: AWS RDS and Aurora)", optIAMAuth, g.iamAuth)
	default:
		awsCfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, "", usagef("outbox: %s: AWS configuration: %v", optIAMAuth, err)
		}
		if src, err = dbcred.RDSIAM(cc, awsCfg); err != nil {
			return nil, "", usagef("outbox: %v", err)
		}
	}
	if cc.Password != "" {
		g.log.Info("the database URL's password (or PGPASSWORD's, or .pgpass's) is not used: "+set[0]+" gives the password of each connection", "option", set[0])
	}
	return src.Password, set[0], nil
}

// withPassword makes a pool's BeforeConnect hook set the password of each
// new connection from pw, as relay.NewPool does with PoolConfig.Password.
func withPassword(pw func(context.Context) (string, error)) func(context.Context, *pgx.ConnConfig) error {
	return func(ctx context.Context, cc *pgx.ConnConfig) error {
		p, err := pw(ctx)
		if err != nil {
			return fmt.Errorf("outbox: database password: %w", err)
		}
		cc.Password = p
		return nil
	}
}
