package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/store"
)

// Why a batch's lines stop before they are all answered.
var (
	errCancelled = errors.New("batch cancelled")
	errExpired   = errors.New("batch expired")
)

// Runner tuning.
const (
	// scanInterval is how often the runner looks for batches to run
	// besides being woken.
	scanInterval = time.Second
	// pageLines is how many pending lines are read at once.
	pageLines = 256
	// statusInterval is how often a running batch's status is re-read
	// (a cancel made elsewhere).
	statusInterval = time.Second
	// maxServerErrors is how many times a line the engine answers with a
	// 5xx runs before that answer is its result.
	maxServerErrors = 3
	// retryBackoff bounds the wait before a requeued line runs again.
	minRetryBackoff, maxRetryBackoff = 250 * time.Millisecond, 10 * time.Second
	// lineTimeout is the longest one line may take; past it, it runs again.
	lineTimeout = 10 * time.Minute
)

// Run runs the batches until ctx ends: it validates new ones, answers
// their lines, writes their files, and resumes the ones a previous run
// left unfinished. Lines in flight when ctx ends are not recorded; they
// run again next time.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(scanInterval)
	defer tick.Stop()
	first := true
	for {
		bs, err := s.o.Store.UnfinishedBatches(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Error("list unfinished batches", "err", err)
		}
		for _, b := range bs {
			s.mu.Lock()
			_, running := s.active[b.ID]
			if !running {
				s.active[b.ID] = nil
			}
			s.mu.Unlock()
			if running {
				continue
			}
			if first && b.Status != store.BatchValidating {
				s.metrics.resumed.Inc()
				s.log.Info("resuming batch", "batch", b.ID, "status", b.Status, "completed", b.Completed, "failed", b.Failed, "total", b.Total)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.drive(ctx, b.ID)
				s.mu.Lock()
				delete(s.active, b.ID)
				s.mu.Unlock()
			}()
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-s.poke:
		case <-tick.C:
		}
	}
}

// drive takes one batch through its statuses until it is final or ctx
// ends.
func (s *Service) drive(ctx context.Context, id string) {
	for ctx.Err() == nil {
		b, err := s.o.Store.Batch(ctx, id)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("read batch", "batch", id, "err", err)
			}
			return
		}
		if b.Status.Final() {
			s.metrics.batches.WithLabelValues(string(b.Status)).Inc()
			s.log.Info("batch finished", "batch", id, "status", b.Status, "completed", b.Completed, "failed", b.Failed, "total", b.Total)
			return
		}
		if err := s.step(ctx, b); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Error("batch step failed; retrying", "batch", id, "status", b.Status, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// step moves a batch on from its status by one status.
func (s *Service) step(ctx context.Context, b Batch) error {
	switch b.Status {
	case store.BatchValidating:
		lines, errs, err := s.validate(ctx, b)
		if err != nil {
			return err
		}
		if len(errs) > 0 {
			list, err := json.Marshal(errs)
			if err != nil {
				return err
			}
			_, err = s.o.Store.MoveBatch(ctx, b.ID, store.BatchFailed, store.BatchUpdate{Errors: list})
			return ignoreRace(err)
		}
		_, err = s.o.Store.MoveBatch(ctx, b.ID, store.BatchInProgress, store.BatchUpdate{Lines: lines})
		return ignoreRace(err)
	case store.BatchInProgress:
		if err := s.runLines(ctx, b); err != nil {
			if errors.Is(err, errExpired) {
				return s.finish(ctx, b, store.BatchExpired, CodeExpired)
			}
			if errors.Is(err, errCancelled) {
				return nil // the status is cancelling now: the next step closes it
			}
			return err
		}
		_, err := s.o.Store.MoveBatch(ctx, b.ID, store.BatchFinalizing, store.BatchUpdate{})
		return ignoreRace(err)
	case store.BatchFinalizing:
		return s.finish(ctx, b, store.BatchCompleted, "")
	case store.BatchCancelling:
		return s.finish(ctx, b, store.BatchCancelled, CodeCancelled)
	}
	return fmt.Errorf("batch %s: no step from status %s", b.ID, b.Status)
}

// ignoreRace drops the error of a move another caller (a cancel) made
// impossible: the next step reads the new status.
func ignoreRace(err error) error {
	if errors.Is(err, store.ErrIllegalTransition) {
		return nil
	}
	return err
}

// finish records the batch's unanswered lines as failed with code (none
// are left for a completed batch), writes its output and error files from
// the lines' records, and moves it to status to.
func (s *Service) finish(ctx context.Context, b Batch, to store.BatchStatus, code string) error {
	if code != "" {
		if err := s.closeLines(ctx, b, code); err != nil {
			return err
		}
	}
	b, err := s.o.Store.Batch(ctx, b.ID)
	if err != nil {
		return err
	}
	var u store.BatchUpdate
	if b.Completed > 0 {
		f, err := s.writeResults(ctx, b, store.LineSucceeded, b.ID+"_output.jsonl")
		if err != nil {
			return err
		}
		u.OutputFileID = f
	}
	if b.Failed > 0 {
		f, err := s.writeResults(ctx, b, store.LineFailed, b.ID+"_error.jsonl")
		if err != nil {
			return err
		}
		u.ErrorFileID = f
	}
	_, err = s.o.Store.MoveBatch(ctx, b.ID, to, u)
	return ignoreRace(err)
}

// closeLines records every pending line of b as failed with code.
func (s *Service) closeLines(ctx context.Context, b Batch, code string) error {
	msg := "This request could not be executed before the completion window expired."
	if code == CodeCancelled {
		msg = "This request was not executed: the batch was cancelled."
	}
	for {
		lines, err := s.o.Store.BatchLines(ctx, b.ID, store.LinePending, 0, pageLines)
		if err != nil || len(lines) == 0 {
			return err
		}
		results := make([]store.LineResult, 0, len(lines))
		for _, l := range lines {
			res, err := resultLine(l.CustomID, nil, &ResultError{Code: code, Message: msg})
			if err != nil {
				return err
			}
			results = append(results, store.LineResult{Line: l.Line, Failed: true, Result: res})
		}
		n, err := s.o.Store.RecordLines(ctx, b.ID, results)
		if err != nil {
			return err
		}
		s.metrics.lines.WithLabelValues("failed").Add(float64(n))
	}
}

// writeResults writes the results of b's lines in state into a new
// batch_output file of b's owner, in line order, and returns its id.
func (s *Service) writeResults(ctx context.Context, b Batch, state store.LineState, name string) (string, error) {
	pr, pw := io.Pipe()
	go func() {
		after := 0
		for {
			lines, err := s.o.Store.BatchLines(ctx, b.ID, state, after, pageLines)
			if err != nil || len(lines) == 0 {
				pw.CloseWithError(err)
				return
			}
			for _, l := range lines {
				if _, err := pw.Write(append(l.Result, '\n')); err != nil {
					return
				}
				after = l.Line
			}
		}
	}()
	f, err := s.o.Files.CreateOutput(ctx, b.Owner, name, pr)
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer if CreateOutput gave up early
	if err != nil {
		return "", fmt.Errorf("write %s of batch %s: %w", name, b.ID, err)
	}
	return f.ID, nil
}

// resultLine encodes a line of the output or error file.
func resultLine(customID string, resp *ResultResponse, rerr *ResultError) (json.RawMessage, error) {
	id, err := newID("batch_req_")
	if err != nil {
		return nil, err
	}
	return json.Marshal(ResultLine{ID: id, CustomID: customID, Response: resp, Error: rerr})
}

// queued is a line waiting to run (again).
type queued struct {
	line      store.BatchLine
	model     string
	notBefore time.Time
	attempts  int // 5xx answers it got, not kept
	refusals  int // times capacity refused it
}

// runLines answers b's pending lines until none is left (nil), the batch
// is cancelled (errCancelled) or expires (errExpired), or ctx ends.
func (s *Service) runLines(ctx context.Context, b Batch) error {
	dctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	dctx, cancelExpiry := context.WithDeadlineCause(dctx, b.ExpiresAt, errExpired)
	defer cancelExpiry()
	s.mu.Lock()
	s.active[b.ID] = stop
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.active[b.ID] = nil
		s.mu.Unlock()
	}()
	go s.watchStatus(dctx, b.ID, stop)

	pending := b.Total - b.Completed - b.Failed
	s.metrics.pending.Add(float64(pending))
	rec := newRecorder(s, b.ID)
	defer func() {
		rec.close()
		s.metrics.pending.Sub(float64(pending - rec.recorded()))
	}()

	var (
		mu       sync.Mutex
		retry    []*queued
		inflight sync.WaitGroup
		idle     = make(chan struct{}, 1) // a line finished
	)
	requeue := func(q *queued, backoff time.Duration) {
		q.notBefore = time.Now().Add(backoff)
		mu.Lock()
		retry = append(retry, q)
		mu.Unlock()
	}
	cursor, exhausted := 0, false
	var page []store.BatchLine
	for {
		if dctx.Err() != nil {
			inflight.Wait()
			return stopCause(ctx, dctx)
		}
		q := s.nextLine(&mu, &retry)
		if q == nil && !exhausted && len(page) == 0 {
			var err error
			page, err = s.o.Store.BatchLines(dctx, b.ID, store.LinePending, cursor, pageLines)
			if err != nil {
				inflight.Wait()
				if dctx.Err() != nil {
					return stopCause(ctx, dctx)
				}
				return err
			}
			if len(page) == 0 {
				exhausted = true
			}
		}
		if q == nil && len(page) > 0 {
			l := page[0]
			page, cursor = page[1:], l.Line
			q = &queued{line: l, model: lineModel(l.Body)}
		}
		if q == nil {
			mu.Lock()
			waiting := len(retry)
			mu.Unlock()
			if waiting == 0 && exhausted {
				inflight.Wait() // what is in flight may requeue
				mu.Lock()
				waiting = len(retry)
				mu.Unlock()
				if waiting == 0 {
					rec.flush()
					more, err := s.o.Store.BatchLines(dctx, b.ID, store.LinePending, 0, 1)
					if err != nil {
						if dctx.Err() != nil {
							return stopCause(ctx, dctx)
						}
						return err
					}
					if len(more) == 0 {
						return nil
					}
					cursor, exhausted = 0, false // a record failed: run what is left again
					continue
				}
			}
			select { // a requeued line's back-off, or a line finishing
			case <-idle:
			case <-time.After(minRetryBackoff):
			case <-dctx.Done():
			}
			continue
		}
		lim := s.limiterFor(q.model)
		if err := lim.acquire(dctx); err != nil {
			continue // dctx ended: the loop's top returns
		}
		inflight.Add(1)
		s.metrics.inflight.Inc()
		go func() {
			defer inflight.Done()
			defer s.metrics.inflight.Dec()
			lim.release(s.runLine(dctx, b, q, rec, requeue))
			select {
			case idle <- struct{}{}:
			default:
			}
		}()
	}
}

// stopCause is why runLines stopped: errCancelled or errExpired, or the
// runner's own ctx ending.
func stopCause(ctx, dctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return context.Cause(dctx)
}

// nextLine takes the first requeued line whose back-off is over.
func (s *Service) nextLine(mu *sync.Mutex, retry *[]*queued) *queued {
	mu.Lock()
	defer mu.Unlock()
	now := time.Now()
	for i, q := range *retry {
		if !q.notBefore.After(now) {
			*retry = append((*retry)[:i], (*retry)[i+1:]...)
			return q
		}
	}
	return nil
}

// watchStatus stops a batch's lines once its status is no longer
// in_progress (cancelled by another gateway, or behind this one's back).
func (s *Service) watchStatus(ctx context.Context, id string, stop context.CancelCauseFunc) {
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := s.o.Store.Batch(ctx, id)
		if err == nil && b.Status != store.BatchInProgress {
			stop(errCancelled)
			return
		}
	}
}

// lineModel is the model a line's body names.
func lineModel(body json.RawMessage) string {
	var m struct {
		Model string `json:"model"`
	}
	json.Unmarshal(body, &m)
	return m.Model
}

// runLine sends one line through the dispatcher and either hands its
// result to the recorder or requeues it, and says how it went (for the
// limiter).
func (s *Service) runLine(ctx context.Context, b Batch, q *queued, rec *recorder, requeue func(*queued, time.Duration)) outcome {
	reqID, err := newID("req_")
	if err != nil {
		requeue(q, minRetryBackoff)
		return outcome{}
	}
	lctx, cancel := context.WithTimeout(ctx, lineTimeout)
	defer cancel()
	if s.o.AsOwner != nil {
		lctx = s.o.AsOwner(lctx, b.Owner)
	}
	req, err := http.NewRequestWithContext(lctx, http.MethodPost, b.Endpoint, bytes.NewReader(q.line.Body))
	if err != nil {
		requeue(q, minRetryBackoff)
		return outcome{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", reqID)
	ans := newAnswer()
	start := time.Now()
	err = s.o.Dispatcher.ServeAt(s.o.Priority, ans, req)
	took := time.Since(start)
	var pre *activator.Preempted
	switch {
	case errors.As(err, &pre):
		s.metrics.preemptions.WithLabelValues(pre.Reason).Inc()
		requeue(q, 0)
		return outcome{refused: true}
	case ctx.Err() != nil: // stopped: the line stays pending
		return outcome{}
	case lctx.Err() != nil: // an engine that never answered
		q.attempts++
		s.metrics.retries.WithLabelValues("timeout").Inc()
		requeue(q, backoffFor(q.attempts))
		return outcome{refused: true}
	}
	status := ans.status
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable ||
		status == http.StatusRequestTimeout || status == 0:
		q.refusals++
		s.metrics.retries.WithLabelValues(strconv.Itoa(status)).Inc()
		requeue(q, backoffFor(q.refusals))
		return outcome{refused: true}
	case status >= 500 && q.attempts+1 < maxServerErrors:
		q.attempts++
		s.metrics.retries.WithLabelValues(strconv.Itoa(status)).Inc()
		requeue(q, backoffFor(q.attempts))
		return outcome{}
	}
	var result json.RawMessage
	if ans.over {
		result, err = resultLine(q.line.CustomID, nil, &ResultError{Code: "answer_too_large",
			Message: fmt.Sprintf("the answer was longer than %d bytes", maxAnswerBytes)})
		status = 0
	} else {
		body := json.RawMessage(ans.body.Bytes())
		if !json.Valid(body) {
			body, _ = json.Marshal(ans.body.String())
		}
		result, err = resultLine(q.line.CustomID, &ResultResponse{StatusCode: status, RequestID: reqID, Body: body}, nil)
	}
	if err != nil {
		requeue(q, minRetryBackoff)
		return outcome{}
	}
	rec.add(store.LineResult{Line: q.line.Line, Failed: status != http.StatusOK, Result: result})
	if status != http.StatusOK {
		return outcome{}
	}
	return outcome{answered: true, perToken: perToken(ans.body.Bytes(), took)}
}

// perToken is an answer's time per output token: how long it took over
// the tokens its usage counts (0 when it counts none).
func perToken(body []byte, took time.Duration) time.Duration {
	var u struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &u) != nil || u.Usage.CompletionTokens <= 0 {
		return 0
	}
	return took / time.Duration(u.Usage.CompletionTokens)
}

// backoffFor is how long a line requeued for the n-th time waits:
// doubling from minRetryBackoff up to maxRetryBackoff.
func backoffFor(n int) time.Duration {
	return min(minRetryBackoff<<min(n-1, 6), maxRetryBackoff)
}
