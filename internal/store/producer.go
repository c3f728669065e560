package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// producerOrigin reads what tells this database apart from others: its
// name, and the cluster's system identifier, which initdb draws at random
// and which physical replicas and base backups keep (so a failover keeps
// it). pg_control_system() is executable by PUBLIC by default.
const producerOrigin = `SELECT current_database(), system_identifier::text FROM pg_catalog.pg_control_system()`

// producerOriginNoControl is producerOrigin where the server refuses
// pg_control_system(): its privilege revoked (a guard in the statement
// cannot help, the executor checks it before it runs), or the function
// replaced by a managed service.
const producerOriginNoControl = `SELECT current_database(), ''`

// ProducerOrigin returns the name of the database q is connected to and
// the cluster's system identifier ("" when the server refuses it), from
// which the relay names its outbox to consumers by default.
func ProducerOrigin(ctx context.Context, q Querier) (database, systemID string, err error) {
	err = q.QueryRow(ctx, producerOrigin).Scan(&database, &systemID)
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		err = q.QueryRow(ctx, producerOriginNoControl).Scan(&database, &systemID)
	}
	return database, systemID, err
}
