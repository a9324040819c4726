package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are the SQLite schema's steps, in order: migrations[i] takes a
// database from user_version i to i+1. Append new steps; never edit or
// reorder released ones. A new step is appended to pgMigrations too, in
// PostgreSQL's dialect: the two lists reach the same schema at each
// version (the build fails when their lengths disagree).
var migrations = [...]string{
	// 1: revisions of models, immutable once recorded except for their
	// validation state.
	`CREATE TABLE revisions (
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		model      TEXT    NOT NULL,
		digest     TEXT    NOT NULL,
		state      TEXT    NOT NULL CHECK (state IN ('validating', 'ready', 'failed')),
		reason     TEXT    NOT NULL DEFAULT '',
		source     TEXT    NOT NULL DEFAULT '',
		manifest   TEXT    NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		UNIQUE (model, digest)
	);
	CREATE INDEX revisions_by_model ON revisions (model, id);`,
	// 2: deployments: a served model name, the revision it serves and its
	// deployment spec.
	`CREATE TABLE deployments (
		name       TEXT    PRIMARY KEY,
		revision   TEXT    NOT NULL,
		spec       TEXT    NOT NULL DEFAULT '{}',
		updated_at INTEGER NOT NULL
	);`,
	// 3: uploaded files (/v1/files): their metadata; the content is a blob
	// in the files store under blob_key.
	`CREATE TABLE files (
		id         TEXT    PRIMARY KEY,
		filename   TEXT    NOT NULL,
		purpose    TEXT    NOT NULL,
		bytes      INTEGER NOT NULL CHECK (bytes >= 0),
		lines      INTEGER NOT NULL CHECK (lines >= 0),
		blob_key   TEXT    NOT NULL,
		created_at INTEGER NOT NULL
	);
	CREATE INDEX files_by_created ON files (created_at, id);`,
	// 4: batches (/v1/batches) and their lines: each line's request and,
	// once it finished, its result line, recorded before it counts.
	`CREATE TABLE batches (
		id                TEXT    PRIMARY KEY,
		input_file_id     TEXT    NOT NULL,
		endpoint          TEXT    NOT NULL,
		completion_window TEXT    NOT NULL,
		metadata          TEXT    NOT NULL DEFAULT '',
		status            TEXT    NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress', 'finalizing',
		                          'completed', 'expired', 'cancelling', 'cancelled')),
		errors            TEXT    NOT NULL DEFAULT '',
		output_file_id    TEXT    NOT NULL DEFAULT '',
		error_file_id     TEXT    NOT NULL DEFAULT '',
		total             INTEGER NOT NULL DEFAULT 0,
		completed         INTEGER NOT NULL DEFAULT 0,
		failed            INTEGER NOT NULL DEFAULT 0,
		created_at        INTEGER NOT NULL,
		expires_at        INTEGER NOT NULL,
		in_progress_at    INTEGER NOT NULL DEFAULT 0,
		finalizing_at     INTEGER NOT NULL DEFAULT 0,
		completed_at      INTEGER NOT NULL DEFAULT 0,
		failed_at         INTEGER NOT NULL DEFAULT 0,
		expired_at        INTEGER NOT NULL DEFAULT 0,
		cancelling_at     INTEGER NOT NULL DEFAULT 0,
		cancelled_at      INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX batches_by_created ON batches (created_at, id);
	CREATE INDEX batches_by_status ON batches (status);
	CREATE TABLE batch_lines (
		batch_id  TEXT    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
		line      INTEGER NOT NULL,
		custom_id TEXT    NOT NULL,
		body      TEXT    NOT NULL,
		state     TEXT    NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed')),
		result    TEXT    NOT NULL DEFAULT '',
		PRIMARY KEY (batch_id, line),
		UNIQUE (batch_id, custom_id)
	);
	CREATE INDEX batch_lines_by_state ON batch_lines (batch_id, state, line);`,
	// 5: tenants and their API keys, stored as SHA-256 hashes.
	`CREATE TABLE tenants (
		id         TEXT    PRIMARY KEY,
		name       TEXT    NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		id         TEXT    PRIMARY KEY,
		tenant_id  TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
		name       TEXT    NOT NULL DEFAULT '',
		hash       BLOB    NOT NULL UNIQUE,
		hint       TEXT    NOT NULL,
		models     TEXT    NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL DEFAULT 0,
		revoked_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);`,
	// 6: the tenant owning each file and batch ('' while auth is off).
	`ALTER TABLE files ADD COLUMN owner TEXT NOT NULL DEFAULT '';
	ALTER TABLE batches ADD COLUMN owner TEXT NOT NULL DEFAULT '';
	CREATE INDEX files_by_owner ON files (owner, created_at, id);
	CREATE INDEX batches_by_owner ON batches (owner, created_at, id);`,
	// 7: the models a batch's lines may name (its creator's key scope, as
	// JSON; '' for any).
	`ALTER TABLE batches ADD COLUMN models TEXT NOT NULL DEFAULT '';`,
	// 8: the limits of tenants and keys (JSON; '' for none).
	`ALTER TABLE tenants ADD COLUMN limits TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN limits TEXT NOT NULL DEFAULT '';`,
	// 9: one usage record per answered (or refused after admission)
	// inference request.
	`CREATE TABLE usage (
		id                INTEGER PRIMARY KEY AUTOINCREMENT,
		request_id        TEXT    NOT NULL,
		tenant_id         TEXT    NOT NULL,
		key_id            TEXT    NOT NULL,
		model             TEXT    NOT NULL,
		status            INTEGER NOT NULL,
		prompt_tokens     INTEGER NOT NULL,
		completion_tokens INTEGER NOT NULL,
		cached_tokens     INTEGER NOT NULL,
		ttft_us           INTEGER NOT NULL,
		duration_us       INTEGER NOT NULL,
		created_at        INTEGER NOT NULL
	);
	CREATE INDEX usage_by_tenant ON usage (tenant_id, created_at);`,
	// 10: what each request cost, in millionths of a US dollar.
	`ALTER TABLE usage ADD COLUMN cost_micro_usd INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX usage_by_key ON usage (key_id, created_at);`,
	// 11: a key's priority class ('' for the default).
	`ALTER TABLE api_keys ADD COLUMN priority TEXT NOT NULL DEFAULT '';`,
	// 12: the usage journal's entry id of a record (NULL for one inserted
	// directly), unique so a journal drained twice records it once.
	`ALTER TABLE usage ADD COLUMN entry TEXT;
	CREATE UNIQUE INDEX usage_by_entry ON usage (entry);`,
	// 13: routes made through the admin API: a client-visible model name
	// and its route (config.Route as JSON).
	`CREATE TABLE routes (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated_at INTEGER NOT NULL);`,
	// 14: a routed request's route, what served it, and how many targets
	// of the route's fallback chain passed it on first.
	`ALTER TABLE usage ADD COLUMN route TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN served TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN fallbacks INTEGER NOT NULL DEFAULT 0;`,
	// 15: rollouts. A revision may be rejected by a rollout's eval gate
	// (the revisions table is rebuilt for its CHECK); a deployment may be
	// pinned to its revision by an operator; a rollout is one candidate
	// revision's canary against the stable one, at most one in progress
	// per deployment.
	`CREATE TABLE revisions_v15 (
		id         INTEGER PRIMARY KEY AUTOINCREMENT,
		model      TEXT    NOT NULL,
		digest     TEXT    NOT NULL,
		state      TEXT    NOT NULL CHECK (state IN ('validating', 'ready', 'failed', 'rejected')),
		reason     TEXT    NOT NULL DEFAULT '',
		source     TEXT    NOT NULL DEFAULT '',
		manifest   TEXT    NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		UNIQUE (model, digest)
	);
	INSERT INTO revisions_v15 (id, model, digest, state, reason, source, manifest, created_at, updated_at)
		SELECT id, model, digest, state, reason, source, manifest, created_at, updated_at FROM revisions;
	DROP TABLE revisions;
	ALTER TABLE revisions_v15 RENAME TO revisions;
	CREATE INDEX revisions_by_model ON revisions (model, id);
	ALTER TABLE deployments ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE rollouts (
		id             INTEGER PRIMARY KEY AUTOINCREMENT,
		deployment     TEXT    NOT NULL,
		stable         TEXT    NOT NULL,
		candidate      TEXT    NOT NULL,
		canary_percent INTEGER NOT NULL,
		spec           TEXT    NOT NULL DEFAULT '{}',
		state          TEXT    NOT NULL,
		reason         TEXT    NOT NULL DEFAULT '',
		eval           TEXT    NOT NULL DEFAULT '',
		created_at     INTEGER NOT NULL,
		updated_at     INTEGER NOT NULL
	);
	CREATE INDEX rollouts_by_deployment ON rollouts (deployment, id);
	CREATE UNIQUE INDEX rollouts_one_canary ON rollouts (deployment) WHERE state = 'canary';`,
	// 16: what the leading gateway publishes for the others (fleet.go):
	// the routable replicas and canary shares of its deployments; and what
	// every gateway reports back: its requests in flight per deployment.
	fleetSchema,
}

// fleetSchema is migration 16 on SQLite; pgFleetSchema on PostgreSQL.
const fleetSchema = `CREATE TABLE fleet_endpoints (
		deployment TEXT    NOT NULL,
		replica    TEXT    NOT NULL,
		addr       TEXT    NOT NULL,
		capacity   INTEGER NOT NULL,
		PRIMARY KEY (deployment, replica)
	);
	CREATE TABLE fleet_canaries (
		deployment TEXT    PRIMARY KEY,
		pool       TEXT    NOT NULL,
		percent    INTEGER NOT NULL
	);
	CREATE TABLE fleet_load (
		gateway     TEXT    NOT NULL,
		deployment  TEXT    NOT NULL,
		concurrency REAL    NOT NULL,
		updated_at  INTEGER NOT NULL,
		PRIMARY KEY (gateway, deployment)
	);`

// pgFleetSchema is fleetSchema in PostgreSQL's types.
const pgFleetSchema = `CREATE TABLE fleet_endpoints (
		deployment TEXT    NOT NULL,
		replica    TEXT    NOT NULL,
		addr       TEXT    NOT NULL,
		capacity   BIGINT  NOT NULL,
		PRIMARY KEY (deployment, replica)
	);
	CREATE TABLE fleet_canaries (
		deployment TEXT    PRIMARY KEY,
		pool       TEXT    NOT NULL,
		percent    BIGINT  NOT NULL
	);
	CREATE TABLE fleet_load (
		gateway     TEXT    NOT NULL,
		deployment  TEXT    NOT NULL,
		concurrency DOUBLE PRECISION NOT NULL,
		updated_at  BIGINT  NOT NULL,
		PRIMARY KEY (gateway, deployment)
	);`

// pgMigrations are the PostgreSQL schema's steps, tracked in the
// schema_version table. The first takes an empty database straight to
// version pgBaseVersion: the schema as SQLite's migrations 1 to 15 leave
// it, in PostgreSQL's types (BIGINT for SQLite's 64-bit INTEGER: the Unix
// nanosecond times, sizes and counts; identity columns for AUTOINCREMENT;
// BYTEA for BLOB). Each later one, pgMigrations[i], takes a database from
// version pgBaseVersion+i-1 to pgBaseVersion+i, the same step as
// migrations[pgBaseVersion+i-1]: append new steps to both lists; never edit
// or reorder released ones.
var pgMigrations = [...]string{
	// 0 → 15.
	`CREATE TABLE revisions (
		id         BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
		model      TEXT    NOT NULL,
		digest     TEXT    NOT NULL,
		state      TEXT    NOT NULL CHECK (state IN ('validating', 'ready', 'failed', 'rejected')),
		reason     TEXT    NOT NULL DEFAULT '',
		source     TEXT    NOT NULL DEFAULT '',
		manifest   TEXT    NOT NULL DEFAULT '',
		created_at BIGINT  NOT NULL,
		updated_at BIGINT  NOT NULL,
		UNIQUE (model, digest)
	);
	CREATE INDEX revisions_by_model ON revisions (model, id);
	CREATE TABLE deployments (
		name       TEXT    PRIMARY KEY,
		revision   TEXT    NOT NULL,
		spec       TEXT    NOT NULL DEFAULT '{}',
		updated_at BIGINT  NOT NULL,
		pinned     BIGINT  NOT NULL DEFAULT 0
	);
	CREATE TABLE files (
		id         TEXT    PRIMARY KEY,
		filename   TEXT    NOT NULL,
		purpose    TEXT    NOT NULL,
		bytes      BIGINT  NOT NULL CHECK (bytes >= 0),
		lines      BIGINT  NOT NULL CHECK (lines >= 0),
		blob_key   TEXT    NOT NULL,
		created_at BIGINT  NOT NULL,
		owner      TEXT    NOT NULL DEFAULT ''
	);
	CREATE INDEX files_by_created ON files (created_at, id);
	CREATE INDEX files_by_owner ON files (owner, created_at, id);
	CREATE TABLE batches (
		id                TEXT    PRIMARY KEY,
		input_file_id     TEXT    NOT NULL,
		endpoint          TEXT    NOT NULL,
		completion_window TEXT    NOT NULL,
		metadata          TEXT    NOT NULL DEFAULT '',
		status            TEXT    NOT NULL CHECK (status IN ('validating', 'failed', 'in_progress', 'finalizing',
		                          'completed', 'expired', 'cancelling', 'cancelled')),
		errors            TEXT    NOT NULL DEFAULT '',
		output_file_id    TEXT    NOT NULL DEFAULT '',
		error_file_id     TEXT    NOT NULL DEFAULT '',
		total             BIGINT  NOT NULL DEFAULT 0,
		completed         BIGINT  NOT NULL DEFAULT 0,
		failed            BIGINT  NOT NULL DEFAULT 0,
		created_at        BIGINT  NOT NULL,
		expires_at        BIGINT  NOT NULL,
		in_progress_at    BIGINT  NOT NULL DEFAULT 0,
		finalizing_at     BIGINT  NOT NULL DEFAULT 0,
		completed_at      BIGINT  NOT NULL DEFAULT 0,
		failed_at         BIGINT  NOT NULL DEFAULT 0,
		expired_at        BIGINT  NOT NULL DEFAULT 0,
		cancelling_at     BIGINT  NOT NULL DEFAULT 0,
		cancelled_at      BIGINT  NOT NULL DEFAULT 0,
		owner             TEXT    NOT NULL DEFAULT '',
		models            TEXT    NOT NULL DEFAULT ''
	);
	CREATE INDEX batches_by_created ON batches (created_at, id);
	CREATE INDEX batches_by_status ON batches (status);
	CREATE INDEX batches_by_owner ON batches (owner, created_at, id);
	CREATE TABLE batch_lines (
		batch_id  TEXT    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
		line      BIGINT  NOT NULL,
		custom_id TEXT    NOT NULL,
		body      TEXT    NOT NULL,
		state     TEXT    NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed')),
		result    TEXT    NOT NULL DEFAULT '',
		PRIMARY KEY (batch_id, line),
		UNIQUE (batch_id, custom_id)
	);
	CREATE INDEX batch_lines_by_state ON batch_lines (batch_id, state, line);
	CREATE TABLE tenants (
		id         TEXT    PRIMARY KEY,
		name       TEXT    NOT NULL UNIQUE,
		created_at BIGINT  NOT NULL,
		limits     TEXT    NOT NULL DEFAULT ''
	);
	CREATE TABLE api_keys (
		id         TEXT    PRIMARY KEY,
		tenant_id  TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
		name       TEXT    NOT NULL DEFAULT '',
		hash       BYTEA   NOT NULL UNIQUE,
		hint       TEXT    NOT NULL,
		models     TEXT    NOT NULL DEFAULT '',
		created_at BIGINT  NOT NULL,
		expires_at BIGINT  NOT NULL DEFAULT 0,
		revoked_at BIGINT  NOT NULL DEFAULT 0,
		limits     TEXT    NOT NULL DEFAULT '',
		priority   TEXT    NOT NULL DEFAULT ''
	);
	CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);
	CREATE TABLE usage (
		id                BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
		request_id        TEXT    NOT NULL,
		tenant_id         TEXT    NOT NULL,
		key_id            TEXT    NOT NULL,
		model             TEXT    NOT NULL,
		status            BIGINT  NOT NULL,
		prompt_tokens     BIGINT  NOT NULL,
		completion_tokens BIGINT  NOT NULL,
		cached_tokens     BIGINT  NOT NULL,
		ttft_us           BIGINT  NOT NULL,
		duration_us       BIGINT  NOT NULL,
		created_at        BIGINT  NOT NULL,
		cost_micro_usd    BIGINT  NOT NULL DEFAULT 0,
		entry             TEXT,
		route             TEXT    NOT NULL DEFAULT '',
		served            TEXT    NOT NULL DEFAULT '',
		fallbacks         BIGINT  NOT NULL DEFAULT 0
	);
	CREATE INDEX usage_by_tenant ON usage (tenant_id, created_at);
	CREATE INDEX usage_by_key ON usage (key_id, created_at);
	CREATE UNIQUE INDEX usage_by_entry ON usage (entry);
	CREATE TABLE routes (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated_at BIGINT NOT NULL);
	CREATE TABLE rollouts (
		id             BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
		deployment     TEXT    NOT NULL,
		stable         TEXT    NOT NULL,
		candidate      TEXT    NOT NULL,
		canary_percent BIGINT  NOT NULL,
		spec           TEXT    NOT NULL DEFAULT '{}',
		state          TEXT    NOT NULL,
		reason         TEXT    NOT NULL DEFAULT '',
		eval           TEXT    NOT NULL DEFAULT '',
		created_at     BIGINT  NOT NULL,
		updated_at     BIGINT  NOT NULL
	);
	CREATE INDEX rollouts_by_deployment ON rollouts (deployment, id);
	CREATE UNIQUE INDEX rollouts_one_canary ON rollouts (deployment) WHERE state = 'canary';`,
	// 16
	pgFleetSchema,
}

// pgBaseVersion is the schema version PostgreSQL's first step reaches.
const pgBaseVersion = 15

// The two lists reach the same version: this fails to compile otherwise.
var _ = [1]struct{}{}[len(migrations)-(pgBaseVersion+len(pgMigrations)-1)]

// pgVersionTable holds a PostgreSQL database's schema version, in its one
// row (id 1).
const pgVersionTable = `CREATE TABLE IF NOT EXISTS schema_version (
	id      INTEGER PRIMARY KEY CHECK (id = 1),
	version INTEGER NOT NULL
);
INSERT INTO schema_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING`

// SchemaVersion is the schema version (SQLite's user_version,
// PostgreSQL's schema_version) of a database this package has brought up
// to date.
const SchemaVersion = len(migrations)

// migrate applies the missing migrations, each in its own write
// transaction together with the version it reaches, so that a crash leaves
// the schema at a whole step and gateways starting together migrate one
// after the other (the later finds the work done).
func (s *Store) migrate(ctx context.Context) error {
	for {
		done, err := s.migrateOne(ctx)
		if err != nil || done {
			return err
		}
	}
}

// migrateOne applies the next missing migration and reports whether the
// schema was already current.
func (s *Store) migrateOne(ctx context.Context) (done bool, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		v, err := s.schemaVersion(ctx, tx)
		if err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		switch {
		case v > SchemaVersion:
			return fmt.Errorf("schema version %d is newer than this binary's %d; upgrade stoke", v, SchemaVersion)
		case v == SchemaVersion:
			done = true
			return nil
		}
		step, next, err := s.step(v)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, step); err != nil {
			return fmt.Errorf("migrate schema from version %d to %d: %w", v, next, err)
		}
		if err := s.setSchemaVersion(ctx, tx, next); err != nil {
			return fmt.Errorf("record schema version %d: %w", next, err)
		}
		return nil
	})
	return done, err
}

// schemaVersion reads the database's schema version (0 for a new one).
func (s *Store) schemaVersion(ctx context.Context, tx *sql.Tx) (int, error) {
	var v int
	if s.dialect == postgresDialect {
		if _, err := tx.ExecContext(ctx, pgVersionTable); err != nil {
			return 0, err
		}
		err := tx.QueryRowContext(ctx, "SELECT version FROM schema_version WHERE id = 1").Scan(&v)
		return v, err
	}
	err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}

// step is the migration that takes the schema from version v (below
// SchemaVersion) on, and the version it reaches.
func (s *Store) step(v int) (string, int, error) {
	if s.dialect == sqliteDialect {
		return migrations[v], v + 1, nil
	}
	switch {
	case v == 0:
		return pgMigrations[0], pgBaseVersion, nil
	case v < pgBaseVersion:
		return "", 0, fmt.Errorf("schema version %d is not one stoke writes on PostgreSQL (0 or %d to %d)", v, pgBaseVersion, SchemaVersion)
	}
	return pgMigrations[v-pgBaseVersion+1], v + 1, nil
}

// setSchemaVersion records the schema version v.
func (s *Store) setSchemaVersion(ctx context.Context, tx *sql.Tx, v int) error {
	if s.dialect == postgresDialect {
		_, err := tx.ExecContext(ctx, "UPDATE schema_version SET version = ? WHERE id = 1", v)
		return err
	}
	// PRAGMA takes no bound parameters; v is a small integer.
	_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v))
	return err
}
