package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// adminKeyEnv names the environment variable of the admin key.
const adminKeyEnv = "STOKE_ADMIN_KEY"

// adminTimeout bounds one admin request.
const adminTimeout = 30 * time.Second

// adminMaxBody bounds what an admin answer may hold.
const adminMaxBody = 32 << 20

// adminClient is what every `stoke admin` command shares: the server and
// the admin key, from the parent command's flags.
type adminClient struct {
	url, key, keyFile string
}

// adminKey returns the admin key: the first line of --admin-key-file,
// else --admin-key, else $STOKE_ADMIN_KEY; "" when none is given.
func (c *adminClient) adminKey() (string, error) {
	if c.keyFile != "" && c.key != "" {
		return "", errors.New("--admin-key and --admin-key-file: give one of them")
	}
	if c.keyFile == "" {
		if c.key != "" {
			return c.key, nil
		}
		return strings.TrimSpace(os.Getenv(adminKeyEnv)), nil
	}
	f, err := os.Open(c.keyFile)
	if err != nil {
		return "", fmt.Errorf("--admin-key-file: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("--admin-key-file %s: %w", c.keyFile, err)
	}
	key := strings.TrimSpace(line)
	if key == "" {
		return "", fmt.Errorf("--admin-key-file %s: the first line is empty", c.keyFile)
	}
	return key, nil
}

// addFlags adds the flags saying which server to reach and the admin
// key to send.
func (c *adminClient) addFlags(pf *pflag.FlagSet) {
	pf.StringVar(&c.url, "url", "http://127.0.0.1:8080", "stoke serve's URL")
	// No default value: the variable's value would show in --help.
	pf.StringVar(&c.key, "admin-key", "", "admin key sent as the bearer token (default $"+adminKeyEnv+")")
	pf.StringVar(&c.keyFile, "admin-key-file", "", "read the admin key from the first line of `PATH`")
}

// adminError is an error answer of an admin endpoint.
type adminError struct {
	// Status is the HTTP status.
	Status int
	// Code is the OpenAI-shaped error's code ("" when the body had none).
	Code string
	// Message is the server's message, or the HTTP status when it sent none.
	Message string
}

func (e *adminError) Error() string { return e.Message }

// do sends an admin request with body (nil for none) encoded as JSON and
// returns the raw answer; when out is not nil the answer is decoded into it
// too. An error answer is an *adminError; a server that cannot be reached
// says so.
func (c *adminClient) do(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	key, err := c.adminKey()
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.url, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) && !errors.Is(err, context.Canceled) {
			return nil, fmt.Errorf("cannot reach stoke serve at %s: %w", c.url, urlErr.Err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, adminMaxBody))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return nil, answerError(resp.StatusCode, raw, key == "")
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("the answer of %s %s is not what stoke admin expects: %w", method, path, err)
		}
	}
	return bytes.TrimSpace(raw), nil
}

// answerError reads an error answer in OpenAI's shape. noKey says that
// the request carried no admin key, which a 401 then points out.
func answerError(status int, raw []byte, noKey bool) *adminError {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	e := &adminError{Status: status}
	if json.Unmarshal(raw, &body) == nil {
		e.Message = body.Error.Message
		if s, ok := body.Error.Code.(string); ok {
			e.Code = s
		}
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	}
	if status == http.StatusUnauthorized && noKey {
		e.Message += " (no admin key given: pass --admin-key-file, --admin-key or set $" + adminKeyEnv + ")"
	}
	return e
}

// printJSON writes a raw JSON answer on its own line.
func printJSON(w io.Writer, raw []byte) error {
	_, err := fmt.Fprintf(w, "%s\n", raw)
	return err
}

func newAdminCmd() *cobra.Command {
	c := &adminClient{}
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Manage the tenants and API keys of stoke serve, and read their usage",
		Long: `Admin drives the /admin endpoints of a running stoke serve: create, list
and delete tenants, create, list and revoke their API keys (sk-stoke-…),
and read the usage recorded per tenant, model and day.
Every request carries the admin key as its bearer token: the first line of
--admin-key-file, else --admin-key, else $STOKE_ADMIN_KEY (the file or the
variable keep it out of the process list and the shell history). The admin
key is never printed.`,
	}
	c.addFlags(cmd.PersistentFlags())
	tenant := &cobra.Command{
		Use:   "tenant",
		Short: "Create, list and delete tenants",
	}
	tenant.AddCommand(newAdminTenantCreateCmd(c), newAdminTenantListCmd(c), newAdminTenantDeleteCmd(c))
	key := &cobra.Command{
		Use:   "key",
		Short: "Create, list and revoke the API keys of tenants",
	}
	key.AddCommand(newAdminKeyCreateCmd(c), newAdminKeyListCmd(c), newAdminKeyRevokeCmd(c))
	cmd.AddCommand(tenant, key, newAdminUsageCmd(c))
	return cmd
}

// adminTenant is a tenant as /admin/tenants answers it.
type adminTenant struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	CreatedAt int64  `json:"created_at"`
}

func newAdminTenantCreateCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant",
		Long: `Create creates a tenant named NAME and prints its id on standard output
(the server's Tenant object with --json). Names are unique.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			var t adminTenant
			raw, err := c.do(cmd.Context(), http.MethodPost, "/admin/tenants", map[string]string{"name": args[0]}, &t)
			if err != nil {
				return fmt.Errorf("admin tenant create: %w", err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), t.ID)
			return err
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's Tenant object")
	return cmd
}

func newAdminTenantListCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tenants",
		Long:  `List prints the tenants: id, name and creation time, or the server's JSON list with --json.`,
		Args:  cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			var list struct {
				Data []adminTenant `json:"data"`
			}
			raw, err := c.do(cmd.Context(), http.MethodGet, "/admin/tenants", nil, &list)
			if err != nil {
				return fmt.Errorf("admin tenant list: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, raw)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tCREATED")
			for _, t := range list.Data {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Name, unixTime(t.CreatedAt))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's JSON list")
	return cmd
}

func newAdminTenantDeleteCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a tenant and its keys",
		Long: `Delete deletes a tenant and every key of it (requests with them are
refused from then on) and prints the tenant's id.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			var del struct {
				ID string `json:"id"`
			}
			raw, err := c.do(cmd.Context(), http.MethodDelete, "/admin/tenants/"+url.PathEscape(id), nil, &del)
			if err != nil {
				return fmt.Errorf("admin tenant delete %s: %w", id, err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			if del.ID == "" {
				del.ID = id
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), del.ID)
			return err
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's answer")
	return cmd
}

// apiKeyObject is an API key as /admin/keys answers it. Key is set only
// in the answer that created it.
type apiKeyObject struct {
	ID        string   `json:"id"`
	TenantID  string   `json:"tenant_id"`
	Name      string   `json:"name"`
	Hint      string   `json:"hint"`
	Models    []string `json:"models"`
	CreatedAt int64    `json:"created_at"`
	ExpiresAt *int64   `json:"expires_at"`
	RevokedAt *int64   `json:"revoked_at"`
	Key       string   `json:"key,omitempty"`
}

// status is the key's state at now: active, revoked or expired.
func (k *apiKeyObject) status(now time.Time) string {
	switch {
	case k.RevokedAt != nil:
		return "revoked"
	case k.ExpiresAt != nil && *k.ExpiresAt <= now.Unix():
		return "expired"
	}
	return "active"
}

func newAdminKeyCreateCmd(c *adminClient) *cobra.Command {
	var (
		tenant, name, expiresIn string
		models                  []string
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "create --tenant TENANT",
		Short: "Create an API key of a tenant; the key is shown once",
		Long: `Create creates an API key (sk-stoke-…) of a tenant, given by id or name,
and prints the key alone on standard output, so that
KEY=$(stoke admin key create --tenant acme) keeps it; with --json it prints
the server's object, key included. The server keeps only its hash: the key
is shown this once and can never be read back (key list shows a hint).
--models limits it to these models (default: all); --expires-in makes it
expire after a duration (720h: 30 days; default: never).`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			if tenant == "" {
				return errors.New("admin key create: --tenant is required")
			}
			req := struct {
				Tenant    string   `json:"tenant"`
				Name      string   `json:"name,omitempty"`
				Models    []string `json:"models,omitempty"`
				ExpiresIn string   `json:"expires_in,omitempty"`
			}{Tenant: tenant, Name: name, ExpiresIn: expiresIn}
			for _, m := range models {
				if m = strings.TrimSpace(m); m != "" {
					req.Models = append(req.Models, m)
				}
			}
			if expiresIn != "" {
				if d, err := time.ParseDuration(expiresIn); err != nil || d <= 0 {
					return fmt.Errorf("admin key create: --expires-in %q: want a positive duration such as 720h", expiresIn)
				}
			}
			var k apiKeyObject
			raw, err := c.do(cmd.Context(), http.MethodPost, "/admin/keys", req, &k)
			if err != nil {
				return fmt.Errorf("admin key create: %w", err)
			}
			if k.Key == "" {
				return fmt.Errorf("admin key create: the server's answer has no key (key %s was created: revoke it)", k.ID)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				err = printJSON(out, raw)
			} else {
				_, err = fmt.Fprintln(out, k.Key)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s of tenant %s (%s): shown once, it cannot be read back; store it now\n", k.ID, k.TenantID, k.Hint)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "the key's tenant: its id or name (required)")
	f.StringVar(&name, "name", "", "a name of the key, for the operator")
	f.StringSliceVar(&models, "models", nil, "the only models the key may use, comma-separated (default: all)")
	f.StringVar(&expiresIn, "expires-in", "", "the key expires after this duration, such as 720h (default: never)")
	f.BoolVar(&asJSON, "json", false, "print the server's object (the key included) instead of the key alone")
	return cmd
}

func newAdminKeyListCmd(c *adminClient) *cobra.Command {
	var (
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List API keys (their hints, never the keys)",
		Long: `List prints the API keys, of one tenant with --tenant: id, tenant, name,
hint (sk-stoke-AbCd…wxyz), models, status (active, expired or revoked),
creation and expiry times; or the server's JSON list with --json. The keys
themselves are never shown: the server does not have them.`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			path := "/admin/keys"
			if tenant != "" {
				path += "?" + url.Values{"tenant": {tenant}}.Encode()
			}
			var list struct {
				Data []apiKeyObject `json:"data"`
			}
			raw, err := c.do(cmd.Context(), http.MethodGet, path, nil, &list)
			if err != nil {
				return fmt.Errorf("admin key list: %w", err)
			}
			for _, k := range list.Data {
				if k.Key != "" {
					// Keys are shown once, when created; never here.
					return fmt.Errorf("admin key list: the server's list holds key %s itself; not shown", k.ID)
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, raw)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tNAME\tHINT\tMODELS\tSTATUS\tCREATED\tEXPIRES")
			for _, k := range list.Data {
				name, mods, expires := orDash(k.Name), "all", "never"
				if len(k.Models) > 0 {
					mods = strings.Join(k.Models, ",")
				}
				if k.ExpiresAt != nil {
					expires = unixTime(*k.ExpiresAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.TenantID, name, k.Hint, mods, k.status(now), unixTime(k.CreatedAt), expires)
			}
			return tw.Flush()
		}),
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "list only this tenant's keys (its id)")
	f.BoolVar(&asJSON, "json", false, "print the server's JSON list")
	return cmd
}

// orDash shows an empty table cell as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newAdminKeyRevokeCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key",
		Long: `Revoke revokes an API key: requests with it are refused (401) from then on.
It prints the key's id and when it was revoked, or the server's key object
with --json.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			var k apiKeyObject
			raw, err := c.do(cmd.Context(), http.MethodPost, "/admin/keys/"+url.PathEscape(id)+"/revoke", nil, &k)
			if err != nil {
				return fmt.Errorf("admin key revoke %s: %w", id, err)
			}
			if k.RevokedAt == nil {
				return fmt.Errorf("admin key revoke %s: the server's answer has no revoked_at", id)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s revoked at %s\n", k.ID, unixTime(*k.RevokedAt))
			return err
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's key object")
	return cmd
}

// usageTotal is the total of one tenant, model and UTC day as
// /admin/usage answers it.
type usageTotal struct {
	TenantID         string `json:"tenant_id"`
	Tenant           string `json:"tenant"`
	Model            string `json:"model"`
	Day              string `json:"day"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
}

func newAdminUsageCmd(c *adminClient) *cobra.Command {
	var (
		tenant, model, since, until string
		asCSV, asJSON               bool
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the usage of tenants per model and day",
		Long: `Usage prints the requests and tokens (prompt, completion, cached) that
stoke serve recorded, summed per tenant, model and UTC day: a table with a
total row, or the server's CSV (--csv, with a header row) or JSON (--json).
--tenant (an id or a name) and --model keep one tenant's or model's usage;
--since and --until (YYYY-MM-DD, UTC, both days included) bound the days.
Requests made with no tenant (auth off, or the admin key) show as "-".`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			if asCSV && asJSON {
				return errors.New("admin usage: --csv and --json: give one of them")
			}
			q := url.Values{}
			for k, v := range map[string]string{"tenant": tenant, "model": model, "since": since, "until": until} {
				if v != "" {
					q.Set(k, v)
				}
			}
			if asCSV {
				q.Set("format", "csv")
			}
			path := "/admin/usage"
			if len(q) > 0 {
				path += "?" + q.Encode()
			}
			var list struct {
				Data []usageTotal `json:"data"`
			}
			var out any = &list
			if asCSV {
				out = nil
			}
			raw, err := c.do(cmd.Context(), http.MethodGet, path, nil, out)
			if err != nil {
				return fmt.Errorf("admin usage: %w", err)
			}
			w := cmd.OutOrStdout()
			if asCSV || asJSON {
				return printJSON(w, raw) // the raw answer on its own lines
			}
			return usageTable(w, list.Data)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "only this tenant's usage: its id or name")
	f.StringVar(&model, "model", "", "only this model's usage")
	f.StringVar(&since, "since", "", "from this UTC day on, included (YYYY-MM-DD)")
	f.StringVar(&until, "until", "", "up to this UTC day, included (YYYY-MM-DD)")
	f.BoolVar(&asCSV, "csv", false, "print the server's CSV (a header row, then a row per tenant, model and day)")
	f.BoolVar(&asJSON, "json", false, "print the server's JSON list")
	return cmd
}

// usageTable writes totals as a table, with a total row when there are
// several.
func usageTable(w io.Writer, totals []usageTotal) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DAY\tTENANT\tNAME\tMODEL\tREQUESTS\tPROMPT_TOKENS\tCOMPLETION_TOKENS\tCACHED_TOKENS")
	var sum usageTotal
	for _, u := range totals {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", u.Day, orDash(u.TenantID), orDash(u.Tenant), orDash(u.Model), u.Requests,
			u.PromptTokens, u.CompletionTokens, u.CachedTokens)
		sum.Requests += u.Requests
		sum.PromptTokens += u.PromptTokens
		sum.CompletionTokens += u.CompletionTokens
		sum.CachedTokens += u.CachedTokens
	}
	if len(totals) > 1 {
		fmt.Fprintf(tw, "TOTAL\t\t\t\t%d\t%d\t%d\t%d\n", sum.Requests, sum.PromptTokens, sum.CompletionTokens, sum.CachedTokens)
	}
	return tw.Flush()
}
