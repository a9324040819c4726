package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/spf13/cobra"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// Polling of `stoke batch submit --wait`.
const (
	// batchPollInterval is the time between two GETs of the batch.
	batchPollInterval = 500 * time.Millisecond
	// batchPollTimeout bounds one GET.
	batchPollTimeout = 30 * time.Second
	// batchPollOutage is how long the server may stay unreachable (a serve
	// restart, say) before --wait gives up; the batch itself goes on.
	batchPollOutage = 2 * time.Minute
	// batchLineEvery is how often the plain (non-terminal) progress prints
	// a line while only the counts change.
	batchLineEvery = 5 * time.Second
)

// batchClient is what every `stoke batch` command shares: the server and
// the key, from the parent command's flags.
type batchClient struct {
	url, apiKey string
}

// client returns an OpenAI client of the server. Requests are not retried
// by default: a POST retried after a lost answer could create a batch
// twice; idempotent calls ask for retries themselves.
func (c *batchClient) client() openai.Client {
	key := c.apiKey
	if key == "" {
		key = os.Getenv("OPENAI_API_KEY")
	}
	if key == "" {
		key = "none"
	}
	return openai.NewClient(option.WithBaseURL(strings.TrimSuffix(c.url, "/")+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// retried lets an idempotent request be retried on a connection error or
// a 5xx.
var retried = option.WithMaxRetries(2)

// describe turns a client error into one line: the server's OpenAI-shaped
// message, or why the server could not be reached.
func (c *batchClient) describe(err error) error {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		msg := apiErr.Message
		if msg == "" {
			msg = fmt.Sprintf("HTTP %d %s", apiErr.StatusCode, http.StatusText(apiErr.StatusCode))
		}
		return &serverError{msg: msg, err: apiErr}
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot reach stoke serve at %s: %w", c.url, urlErr.Err)
	}
	return err
}

// serverError is an error the server answered, shown as its message.
type serverError struct {
	msg string
	err *openai.Error
}

func (e *serverError) Error() string { return e.msg }

// Unwrap gives the client's *openai.Error.
func (e *serverError) Unwrap() error { return e.err }

// permanent reports whether err is an answer that asking again will not
// change (a 4xx other than a timeout or a rate limit).
func permanent(err error) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode >= 400 && apiErr.StatusCode < 500 &&
		apiErr.StatusCode != http.StatusRequestTimeout && apiErr.StatusCode != http.StatusTooManyRequests
}

// oneLine keeps a command's error on one line, whatever the server sent.
func oneLine(run func(cmd *cobra.Command, args []string) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := run(cmd, args); err != nil {
			return &flatError{err: err}
		}
		return nil
	}
}

// flatError is an error whose message has its line breaks folded.
type flatError struct{ err error }

func (e *flatError) Error() string {
	return strings.Join(strings.Fields(strings.ReplaceAll(e.err.Error(), "\n", " ")), " ")
}

// Unwrap gives the original error.
func (e *flatError) Unwrap() error { return e.err }

func newBatchCmd() *cobra.Command {
	c := &batchClient{}
	cmd := &cobra.Command{
		Use:   "batch",
		Short: "Submit Batch API jobs to stoke serve and follow them",
		Long: `Batch drives /v1/files and /v1/batches of a running stoke serve (OpenAI's
Batch API) with the official OpenAI client: submit a JSONL file of requests,
list, inspect and cancel batches, and fetch their output and error files.
The key is --api-key, else $OPENAI_API_KEY, else "none".`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.url, "url", "http://127.0.0.1:8080", "stoke serve's URL")
	pf.StringVar(&c.apiKey, "api-key", "", `API key sent as the bearer token (default $OPENAI_API_KEY, else "none")`)
	cmd.AddCommand(newBatchSubmitCmd(c), newBatchListCmd(c), newBatchGetCmd(c), newBatchCancelCmd(c), newBatchResultsCmd(c))
	return cmd
}

func newBatchSubmitCmd(c *batchClient) *cobra.Command {
	var (
		endpoint, window, output, errorsPath string
		metadata                             []string
		wait, quiet                          bool
	)
	cmd := &cobra.Command{
		Use:   "submit FILE.jsonl",
		Short: "Upload a JSONL file of requests and create a batch of it",
		Long: `Submit uploads FILE (purpose batch), creates a batch of it and prints the
batch's id on standard output. The endpoint is --endpoint, else the "url" of
FILE's first line. With --wait it follows the batch to its end, with a
progress bar of lines on standard error (plain status lines when that is
not a terminal), prints a summary there, and writes the output and error
files to --output and --errors (empty when the batch has none). It exits
non-zero when the batch ends failed (its validation errors are listed),
expired or cancelled.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			path := args[0]
			if !wait && (output != "" || errorsPath != "") {
				return errors.New("--output and --errors need --wait (or fetch them later with `stoke batch results ID`)")
			}
			meta, err := parseMetadata(metadata)
			if err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("batch submit: %w", err)
			}
			defer f.Close()
			if endpoint == "" {
				if endpoint, err = firstLineURL(f); err != nil {
					return fmt.Errorf("batch submit: %s: %w", path, err)
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return fmt.Errorf("batch submit: %s: %w", path, err)
				}
			}
			ctx := cmd.Context()
			client := c.client()
			file, err := client.Files.New(ctx, openai.FileNewParams{
				File:    openai.File(f, filepath.Base(path), "application/jsonl"),
				Purpose: openai.FilePurposeBatch,
			})
			if err != nil {
				return fmt.Errorf("batch submit: upload %s: %w", path, c.describe(err))
			}
			b, err := client.Batches.New(ctx, openai.BatchNewParams{
				InputFileID:      file.ID,
				Endpoint:         openai.BatchNewParamsEndpoint(endpoint),
				CompletionWindow: openai.BatchNewParamsCompletionWindow(window),
				Metadata:         meta,
			})
			if err != nil {
				// The upload is of no use without its batch.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				client.Files.Delete(dctx, file.ID, retried)
				cancel()
				return fmt.Errorf("batch submit: create: %w", c.describe(err))
			}
			fmt.Fprintln(cmd.OutOrStdout(), b.ID)
			if !wait {
				return nil
			}
			return c.follow(cmd, &client, b, quiet, output, errorsPath)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "", "endpoint of every line: /v1/chat/completions or /v1/completions (default: the first line's url)")
	f.StringVar(&window, "completion-window", "24h", "time the batch has to finish")
	f.StringArrayVar(&metadata, "metadata", nil, "a metadata pair KEY=VALUE of the batch (repeatable)")
	f.BoolVar(&wait, "wait", false, "follow the batch until it ends")
	f.BoolVarP(&quiet, "quiet", "q", false, "with --wait, show no progress (the summary still)")
	f.StringVarP(&output, "output", "o", "", "with --wait, write the output file (successful lines) here")
	f.StringVar(&errorsPath, "errors", "", "with --wait, write the error file (failed lines) here")
	return cmd
}

// parseMetadata reads --metadata KEY=VALUE pairs.
func parseMetadata(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	meta := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--metadata %q: want KEY=VALUE", p)
		}
		meta[k] = v
	}
	return meta, nil
}

// firstLineURL reads the "url" of a batch input's first request.
func firstLineURL(r io.Reader) (string, error) {
	var line struct {
		URL string `json:"url"`
	}
	if err := json.NewDecoder(r).Decode(&line); err != nil {
		if errors.Is(err, io.EOF) {
			return "", errors.New("the file is empty")
		}
		return "", fmt.Errorf("line 1 is not a request to infer the endpoint from (%w); pass --endpoint", err)
	}
	if line.URL == "" {
		return "", errors.New(`line 1 has no "url" to infer the endpoint from; pass --endpoint`)
	}
	return line.URL, nil
}

// follow waits for batch b to end, then reports it and writes its files.
func (c *batchClient) follow(cmd *cobra.Command, client *openai.Client, b *openai.Batch, quiet bool, output, errorsPath string) error {
	ctx, stderr := cmd.Context(), cmd.ErrOrStderr()
	start := time.Now()
	prog := newBatchProgress(ctx, stderr, b.ID, quiet)
	final, err := waitBatch(ctx, client, b, prog.update)
	prog.end(final)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("batch %s: stopped waiting; the batch goes on (see `stoke batch get %s`)", b.ID, b.ID)
		}
		return fmt.Errorf("batch %s: %w", b.ID, c.describe(err))
	}
	rc := final.RequestCounts
	summary := fmt.Sprintf("batch %s %s in %s: %d completed, %d failed, %d total", final.ID, final.Status,
		time.Since(start).Round(100*time.Millisecond), rc.Completed, rc.Failed, rc.Total)
	for _, w := range []struct{ path, id, what string }{{output, final.OutputFileID, "output"}, {errorsPath, final.ErrorFileID, "errors"}} {
		if w.path == "" {
			continue
		}
		if err := c.download(ctx, client, w.id, w.path); err != nil {
			return fmt.Errorf("batch %s: write %s to %s: %w", final.ID, w.what, w.path, err)
		}
		summary += fmt.Sprintf("; %s in %s", w.what, w.path)
	}
	fmt.Fprintln(stderr, summary)
	switch final.Status {
	case openai.BatchStatusCompleted:
		return nil
	case openai.BatchStatusFailed:
		for _, e := range final.Errors.Data {
			fmt.Fprintln(stderr, " ", lineErrorText(e))
		}
		return fmt.Errorf("batch %s failed: %d validation errors", final.ID, len(final.Errors.Data))
	}
	return fmt.Errorf("batch %s %s with %d of %d lines answered", final.ID, final.Status, rc.Completed+rc.Failed, rc.Total)
}

// lineErrorText is a validation error as one line: where, what, the code.
func lineErrorText(e openai.BatchError) string {
	msg := e.Message
	if e.JSON.Line.Valid() {
		prefix := fmt.Sprintf("line %d: ", e.Line)
		msg = prefix + strings.TrimPrefix(msg, prefix)
	}
	if e.Code != "" {
		msg += " (" + e.Code + ")"
	}
	return strings.Join(strings.Fields(msg), " ")
}

// batchFinal reports whether a batch with status s has ended.
func batchFinal(s openai.BatchStatus) bool {
	switch s {
	case openai.BatchStatusCompleted, openai.BatchStatusFailed, openai.BatchStatusExpired, openai.BatchStatusCancelled:
		return true
	}
	return false
}

// waitBatch polls batch b until it ends, passing each state to update. A
// server that stops answering for a while (restarting) is waited for; an
// answer that will not change (404) ends the wait.
func waitBatch(ctx context.Context, client *openai.Client, b *openai.Batch, update func(*openai.Batch)) (*openai.Batch, error) {
	tick := time.NewTicker(batchPollInterval)
	defer tick.Stop()
	var outage time.Time
	for {
		update(b)
		if batchFinal(b.Status) {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return b, ctx.Err()
		case <-tick.C:
		}
		next, err := client.Batches.Get(ctx, b.ID, option.WithRequestTimeout(batchPollTimeout))
		switch {
		case err == nil:
			b, outage = next, time.Time{}
		case ctx.Err() != nil:
			return b, ctx.Err()
		case permanent(err):
			return b, err
		case outage.IsZero():
			outage = time.Now()
		case time.Since(outage) > batchPollOutage:
			return b, fmt.Errorf("no answer for %v: %w", batchPollOutage, err)
		}
	}
}

// batchProgress shows a batch advancing.
type batchProgress interface {
	// update is called with each state polled.
	update(b *openai.Batch)
	// end is called once, with the last state polled.
	end(b *openai.Batch)
}

// newBatchProgress picks the display for w: none when quiet, a bar of
// lines on a terminal, a status line now and then otherwise.
func newBatchProgress(ctx context.Context, w io.Writer, id string, quiet bool) batchProgress {
	switch {
	case quiet:
		return nopBatchProgress{}
	case !cupwriter.New(w, false).IsTerminal():
		return &lineBatchProgress{w: w}
	}
	b := &barBatchProgress{p: mpb.NewWithContext(ctx, mpb.WithOutput(w), mpb.WithWidth(40))}
	b.status.Store("validating")
	b.bar = b.p.AddBar(0,
		mpb.PrependDecorators(decor.Name(id, decor.WCSyncSpaceR),
			decor.Any(func(decor.Statistics) string { return b.status.Load().(string) }, decor.WC{W: len("in_progress") + 1, C: decor.DindentRight})),
		mpb.AppendDecorators(decor.CountersNoUnit("%d / %d lines"),
			decor.Any(func(decor.Statistics) string {
				if n := b.failed.Load(); n > 0 {
					return fmt.Sprintf(", %d failed", n)
				}
				return ""
			}),
			decor.Name(" "), decor.Elapsed(decor.ET_STYLE_GO)),
	)
	return b
}

type nopBatchProgress struct{}

func (nopBatchProgress) update(*openai.Batch) {}
func (nopBatchProgress) end(*openai.Batch)    {}

// lineBatchProgress prints a line when the status changes, and while the
// batch runs at most one every batchLineEvery when only its counts do.
type lineBatchProgress struct {
	w       io.Writer
	status  openai.BatchStatus
	counts  openai.BatchRequestCounts
	printed time.Time
}

func (l *lineBatchProgress) update(b *openai.Batch) {
	rc := b.RequestCounts
	changed := rc.Completed != l.counts.Completed || rc.Failed != l.counts.Failed || rc.Total != l.counts.Total
	if b.Status == l.status && (!changed || time.Since(l.printed) < batchLineEvery) {
		return
	}
	l.status, l.counts, l.printed = b.Status, rc, time.Now()
	if rc.Total == 0 {
		fmt.Fprintf(l.w, "batch %s %s\n", b.ID, b.Status)
		return
	}
	fmt.Fprintf(l.w, "batch %s %s: %d / %d lines (%d failed)\n", b.ID, b.Status, rc.Completed+rc.Failed, rc.Total, rc.Failed)
}

func (l *lineBatchProgress) end(*openai.Batch) {}

// barBatchProgress draws one bar of lines answered.
type barBatchProgress struct {
	p      *mpb.Progress
	bar    *mpb.Bar
	status atomic.Value // string
	failed atomic.Int64
}

func (p *barBatchProgress) update(b *openai.Batch) {
	rc := b.RequestCounts
	p.status.Store(string(b.Status))
	p.failed.Store(rc.Failed)
	if rc.Total > 0 {
		p.bar.SetTotal(rc.Total, false)
	}
	p.bar.SetCurrent(rc.Completed + rc.Failed)
}

func (p *barBatchProgress) end(b *openai.Batch) {
	if b != nil && b.Status == openai.BatchStatusCompleted {
		p.bar.SetTotal(-1, true)
	} else {
		p.bar.Abort(false)
	}
	p.p.Wait()
}

// download writes file id's content to path (an empty file when id is
// empty: the batch has no such file), through a temporary file renamed
// into place once complete.
func (c *batchClient) download(ctx context.Context, client *openai.Client, id, path string) error {
	var body io.Reader = strings.NewReader("")
	if id != "" {
		resp, err := client.Files.Content(ctx, id, retried)
		if err != nil {
			return c.describe(err)
		}
		defer resp.Body.Close()
		body = resp.Body
	}
	return writeFileAtomic(path, body)
}

// writeFileAtomic writes r to path so that path is either its old self or
// all of r.
func writeFileAtomic(path string, r io.Reader) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func newBatchListCmd(c *batchClient) *cobra.Command {
	var (
		limit  int
		after  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List batches, newest first",
		Long: `List prints a page of batches, newest first: id, status, requests
(completed/failed/total) and creation time, or the server's JSON page with
--json. When there are more, it says on standard error how to ask for the
next page (--after the last id).`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			client := c.client()
			params := openai.BatchListParams{Limit: openai.Int(int64(limit))}
			if after != "" {
				params.After = openai.String(after)
			}
			page, err := client.Batches.List(cmd.Context(), params, retried)
			if err != nil {
				return fmt.Errorf("batch list: %w", c.describe(err))
			}
			out := cmd.OutOrStdout()
			if asJSON {
				_, err := fmt.Fprintln(out, page.RawJSON())
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tCOMPLETED/FAILED/TOTAL\tCREATED")
			for _, b := range page.Data {
				rc := b.RequestCounts
				fmt.Fprintf(tw, "%s\t%s\t%d/%d/%d\t%s\n", b.ID, b.Status, rc.Completed, rc.Failed, rc.Total, unixTime(b.CreatedAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if page.HasMore && len(page.Data) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: stoke batch list --after %s\n", page.Data[len(page.Data)-1].ID)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.IntVar(&limit, "limit", 20, "batches on the page (1 to 100)")
	f.StringVar(&after, "after", "", "list the batches older than this batch id")
	f.BoolVar(&asJSON, "json", false, "print the server's JSON page")
	return cmd
}

// unixTime shows a Unix time in local time.
func unixTime(sec int64) string {
	return time.Unix(sec, 0).Format("2006-01-02 15:04:05")
}

func newBatchGetCmd(c *batchClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a batch",
		Long: `Get prints a batch: status, request counts, files, timestamps, metadata
and validation errors, or the server's Batch object with --json.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			client := c.client()
			b, err := client.Batches.Get(cmd.Context(), id, retried)
			if err != nil {
				return fmt.Errorf("batch %s: %w", id, c.describe(err))
			}
			if asJSON {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), b.RawJSON())
				return err
			}
			return printBatch(cmd.OutOrStdout(), b)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's Batch object")
	return cmd
}

// printBatch writes b's human-readable summary to w.
func printBatch(w io.Writer, b *openai.Batch) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	rc := b.RequestCounts
	row("id", b.ID)
	row("status", string(b.Status))
	row("endpoint", b.Endpoint)
	row("completion window", b.CompletionWindow)
	row("requests", fmt.Sprintf("%d completed, %d failed, %d total", rc.Completed, rc.Failed, rc.Total))
	row("input file", b.InputFileID)
	row("output file", b.OutputFileID)
	row("error file", b.ErrorFileID)
	for _, t := range []struct {
		name string
		at   int64
	}{
		{"created", b.CreatedAt}, {"in progress", b.InProgressAt}, {"finalizing", b.FinalizingAt},
		{"completed", b.CompletedAt}, {"failed", b.FailedAt}, {"expired", b.ExpiredAt},
		{"cancelling", b.CancellingAt}, {"cancelled", b.CancelledAt}, {"expires", b.ExpiresAt},
	} {
		if t.at != 0 {
			row(t.name, unixTime(t.at))
		}
	}
	keys := make([]string, 0, len(b.Metadata))
	for k := range b.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		row("metadata", k+"="+b.Metadata[k])
	}
	for _, e := range b.Errors.Data {
		row("error", lineErrorText(e))
	}
	return tw.Flush()
}

func newBatchCancelCmd(c *batchClient) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a batch",
		Long: `Cancel asks the server to cancel a batch and prints its new status
(cancelling, then cancelled once its lines in flight have ended; the lines
answered so far stay in its files). A batch that has ended cannot be
cancelled.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			client := c.client()
			b, err := client.Batches.Cancel(cmd.Context(), id)
			if err != nil {
				return fmt.Errorf("batch %s: %w", id, c.describe(err))
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), b.Status)
			return err
		}),
	}
}

func newBatchResultsCmd(c *batchClient) *cobra.Command {
	var (
		errorFile bool
		output    string
	)
	cmd := &cobra.Command{
		Use:   "results ID",
		Short: "Write a batch's output file (or its error file) to standard output or a file",
		Long: `Results writes the content of a batch's output file, one JSON line per
successful request, or with --errors of its error file, one per failed
request, to standard output or -o PATH.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			ctx := cmd.Context()
			client := c.client()
			b, err := client.Batches.Get(ctx, id, retried)
			if err != nil {
				return fmt.Errorf("batch %s: %w", id, c.describe(err))
			}
			fileID, what := b.OutputFileID, "output"
			if errorFile {
				fileID, what = b.ErrorFileID, "error"
			}
			if fileID == "" {
				if batchFinal(b.Status) {
					return fmt.Errorf("batch %s: no %s file (the batch is %s with %d completed, %d failed)",
						id, what, b.Status, b.RequestCounts.Completed, b.RequestCounts.Failed)
				}
				return fmt.Errorf("batch %s: no %s file yet (the batch is %s)", id, what, b.Status)
			}
			if output != "" {
				if err := c.download(ctx, &client, fileID, output); err != nil {
					return fmt.Errorf("batch %s: write %s file to %s: %w", id, what, output, err)
				}
				return nil
			}
			resp, err := client.Files.Content(ctx, fileID, retried)
			if err != nil {
				return fmt.Errorf("batch %s: %s file %s: %w", id, what, fileID, c.describe(err))
			}
			defer resp.Body.Close()
			if _, err := io.Copy(cmd.OutOrStdout(), resp.Body); err != nil {
				return fmt.Errorf("batch %s: %s file %s: %w", id, what, fileID, err)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&errorFile, "errors", false, "the error file instead of the output file")
	f.StringVarP(&output, "output", "o", "", "write to this file instead of standard output")
	return cmd
}
