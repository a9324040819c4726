package store

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/internal/store/pgtest"
)

// schemaOf describes a database's schema, one line per fact, sorted, in
// terms both databases share: each column's type (SQLite's INTEGER, TEXT,
// BLOB and REAL as PostgreSQL's bigint, text, bytea and double precision), nullability (a primary
// key's columns count as not null) and default; each table's primary key,
// unique constraints, foreign keys and number of CHECKs; each named index's
// columns, uniqueness and partiality.
type schemaOf func(t *testing.T, ctx context.Context, db *sql.DB) []string

// queryStrings runs query and returns its rows, each row's columns joined
// by "|".
func queryStrings(t *testing.T, ctx context.Context, db *sql.DB, query string, args ...any) [][]string {
	t.Helper()
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = v.String
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sqliteSchema(t *testing.T, ctx context.Context, db *sql.DB) []string {
	var facts []string
	types := map[string]string{"INTEGER": "bigint", "TEXT": "text", "BLOB": "bytea", "REAL": "double precision"}
	for _, tr := range queryStrings(t, ctx, db, `SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`) {
		table, ddl := tr[0], tr[1]
		var pk []string
		for _, c := range queryStrings(t, ctx, db, `SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?) ORDER BY pk`, table) {
			notNull := c[2] == "1" || c[4] != "0"
			facts = append(facts, fmt.Sprintf("%s.%s %s notnull=%v default=%s", table, c[0], types[c[1]], notNull, c[3]))
			if c[4] != "0" {
				pk = append(pk, c[0])
			}
		}
		facts = append(facts, fmt.Sprintf("%s primary key (%s)", table, strings.Join(pk, ", ")))
		facts = append(facts, fmt.Sprintf("%s checks %d", table, strings.Count(ddl, "CHECK (")))
		for _, fk := range queryStrings(t, ctx, db, `SELECT "from", "table", "to", on_delete FROM pragma_foreign_key_list(?)`, table) {
			facts = append(facts, fmt.Sprintf("%s foreign key (%s) references %s(%s) on delete %s", table, fk[0], fk[1], fk[2], strings.ToLower(fk[3])))
		}
		for _, ix := range queryStrings(t, ctx, db, `SELECT name, "unique", origin, partial FROM pragma_index_list(?)`, table) {
			var cols []string
			for _, c := range queryStrings(t, ctx, db, `SELECT name FROM pragma_index_info(?) ORDER BY seqno`, ix[0]) {
				cols = append(cols, c[0])
			}
			switch ix[2] {
			case "u":
				facts = append(facts, fmt.Sprintf("%s unique (%s)", table, strings.Join(cols, ", ")))
			case "c":
				facts = append(facts, fmt.Sprintf("index %s on %s (%s) unique=%v partial=%v", ix[0], table, strings.Join(cols, ", "), ix[1] == "1", ix[3] == "1"))
			}
		}
	}
	slices.Sort(facts)
	return facts
}

func postgresSchema(t *testing.T, ctx context.Context, db *sql.DB) []string {
	var facts []string
	defaultCast := regexp.MustCompile(`::[a-z ]+$`)
	for _, c := range queryStrings(t, ctx, db, `SELECT c.table_name, c.column_name, c.data_type, c.is_nullable, c.column_default
		FROM information_schema.columns c JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' AND c.table_name <> 'schema_version'`) {
		facts = append(facts, fmt.Sprintf("%s.%s %s notnull=%v default=%s", c[0], c[1], c[2], c[3] == "NO", defaultCast.ReplaceAllString(c[4], "")))
	}
	colList := regexp.MustCompile(`\(([^)]*)\)`)
	checks := map[string]int{}
	for _, tr := range queryStrings(t, ctx, db, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_version'`) {
		checks[tr[0]] = 0
	}
	for _, k := range queryStrings(t, ctx, db, `SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid) FROM pg_constraint
		WHERE connamespace = 'public'::regnamespace AND conrelid <> 'schema_version'::regclass`) {
		table, def := k[0], k[2]
		switch k[1] {
		case "p":
			facts = append(facts, fmt.Sprintf("%s primary key (%s)", table, colList.FindStringSubmatch(def)[1]))
		case "u":
			facts = append(facts, fmt.Sprintf("%s unique (%s)", table, colList.FindStringSubmatch(def)[1]))
		case "c":
			checks[table]++
		case "f":
			m := regexp.MustCompile(`^FOREIGN KEY \((\w+)\) REFERENCES (\w+)\((\w+)\)(?: ON DELETE (.+))?$`).FindStringSubmatch(def)
			if m == nil {
				t.Fatalf("foreign key %q of %s", def, table)
			}
			onDelete := strings.ToLower(m[4])
			if onDelete == "" {
				onDelete = "no action"
			}
			facts = append(facts, fmt.Sprintf("%s foreign key (%s) references %s(%s) on delete %s", table, m[1], m[2], m[3], onDelete))
		}
	}
	for table, n := range checks {
		facts = append(facts, fmt.Sprintf("%s checks %d", table, n))
	}
	for _, ix := range queryStrings(t, ctx, db, `SELECT i.indexname, i.tablename, i.indexdef FROM pg_indexes i
		WHERE i.schemaname = 'public' AND i.tablename <> 'schema_version'
		AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = (quote_ident(i.indexname))::regclass)`) {
		def := ix[2]
		facts = append(facts, fmt.Sprintf("index %s on %s (%s) unique=%v partial=%v", ix[0], ix[1], colList.FindStringSubmatch(def)[1],
			strings.HasPrefix(def, "CREATE UNIQUE"), strings.Contains(def, " WHERE ")))
	}
	slices.Sort(facts)
	return facts
}

// TestSchemasAgree: SQLite's migrations and PostgreSQL's reach the same
// schema: the same tables, columns, keys, constraints and indexes. A step
// appended to one list and not (or not alike) to the other fails here.
func TestSchemasAgree(t *testing.T) {
	ctx := context.Background()
	lite := backend{name: "sqlite"}
	pg := backend{name: "postgres", postgres: true}
	pgURL := pgtest.Start(t)
	liteAt, pgAt := lite.fresh(t), target{state: pgURL, dir: t.TempDir()}
	openAt(t, liteAt)
	openAt(t, pgAt)
	got := map[string][]string{
		"sqlite":   sqliteSchema(t, ctx, rawDB(t, lite, liteAt)),
		"postgres": postgresSchema(t, ctx, rawDB(t, pg, pgAt)),
	}
	if len(got["sqlite"]) < 100 {
		t.Fatalf("the SQLite schema has %d facts; the query missed it", len(got["sqlite"]))
	}
	for _, pair := range [][2]string{{"sqlite", "postgres"}, {"postgres", "sqlite"}} {
		for _, f := range got[pair[0]] {
			if !slices.Contains(got[pair[1]], f) {
				t.Errorf("%s has, %s lacks: %s", pair[0], pair[1], f)
			}
		}
	}
}
