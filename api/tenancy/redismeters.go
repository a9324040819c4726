package tenancy

import (
	"context"
	_ "embed" // the Lua scripts
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// DefaultRedisPrefix starts the names of the Redis keys of the limits'
// counters unless Options.RedisPrefix says otherwise.
const DefaultRedisPrefix = "stoke:limits:"

// DefaultRedisLease is how long an admitted request counts as in flight
// in Redis when its end is never settled, unless Options.RedisLease says
// otherwise.
const DefaultRedisLease = 30 * time.Minute

// settleTimeout bounds the settling of a request's end in Redis (Done has
// no context of its own).
const settleTimeout = 5 * time.Second

var (
	//go:embed redis_admit.lua
	admitLua string
	//go:embed redis_settle.lua
	settleLua string
)

// redisMeters are meters shared by every gateway replica on one Redis:
// each admission is one EVALSHA of redis_admit.lua, which checks and
// reserves in the tenant's and the key's meters atomically, and each end
// one of redis_settle.lua. Safe for concurrent use.
//
// Keys: PREFIX{TENANT}:t:… for the tenant's meter and
// PREFIX{TENANT}:k:KEY:… for a key's, so that a request's keys share one
// hash slot (Redis Cluster): :w (the window's reservations), :f (the
// requests in flight), :h (their tokens and sums), which live for
// lease+window+1m after their last use, and :st:DATE, :sm:DATE (a budget
// period's tokens and micro-USD spent), which live until a day after the
// period ends.
//
// The clock is Redis's (TIME, in the script) unless Options.Now was set:
// one clock for every replica, so that a window is a minute long whatever
// the replicas' clocks say and no skew lets a replica see another's
// reservation leave early. A caller's clock (a test's) is passed in
// instead. Budget periods and the usage records keep the caller's clock.
type redisMeters struct {
	c      redis.UniversalClient
	prefix string
	lease  time.Duration
	// serverClock: the script reads Redis's TIME; else a.now is sent.
	serverClock bool
	spend       spendFunc
	log         *slog.Logger

	admitScript, settleScript *redis.Script
	// inits coalesces this process's readings of a period's spend.
	inits singleflight.Group
}

// newRedisMeters returns meters on c and loads their scripts (a failure
// only logs: the first admission loads them again).
func newRedisMeters(ctx context.Context, c redis.UniversalClient, prefix string, lease time.Duration, serverClock bool, spend spendFunc, log *slog.Logger) *redisMeters {
	if prefix == "" {
		prefix = DefaultRedisPrefix
	}
	if lease <= 0 {
		lease = DefaultRedisLease
	}
	rm := &redisMeters{c: c, prefix: prefix, lease: lease, serverClock: serverClock, spend: spend, log: log,
		admitScript: redis.NewScript(admitLua), settleScript: redis.NewScript(settleLua)}
	for _, s := range []*redis.Script{rm.admitScript, rm.settleScript} {
		if err := s.Load(ctx, c).Err(); err != nil {
			log.Warn("load the limits' scripts into Redis", "err", err)
		}
	}
	return rm
}

// ttl is how long a meter's window and in-flight keys outlive their last
// use.
func (rm *redisMeters) ttl() time.Duration { return rm.lease + window + time.Minute }

// keys are the Redis keys of h's meter (w, f, h, st, sm; see
// redis_admit.lua), the budget's those of the period holding now.
func (rm *redisMeters) keys(h holder, now time.Time) []string {
	base := rm.prefix + "{" + h.tenant + "}:t"
	if h.name[0] == 'k' {
		base = rm.prefix + "{" + h.tenant + "}:k:" + h.key
	}
	period := h.limits.periodStart(now).Format("20060102")
	return []string{base + ":w", base + ":f", base + ":h", base + ":st:" + period, base + ":sm:" + period}
}

// admit is meters.admit: one round trip, and, at a budgeted holder's
// first use in a period, a reading of its spend and one more.
func (rm *redisMeters) admit(ctx context.Context, a admission) ([2]meterState, func(usedTokens, usedMicro int64), error) {
	var states [2]meterState
	var keys []string
	now := ""
	if !rm.serverClock {
		now = strconv.FormatInt(a.now.UnixMicro(), 10)
	}
	id := "#" + strconv.FormatUint(rand.Uint64(), 36) // never a field of its own ("sum", "rt", "rm")
	ttl := rm.ttl().Milliseconds()
	args := []any{now, window.Microseconds(), rm.lease.Microseconds(), ttl, id, a.tokens, a.micro}
	for _, h := range a.holders {
		keys = append(keys, rm.keys(h, a.now)...)
		l := h.limits
		budgeted := 0
		if l.budgeted() {
			budgeted = 1
		}
		args = append(args, l.RequestsPerMinute, l.TokensPerMinute, l.MaxConcurrent, l.BudgetTokens, l.budgetMicro(), budgeted)
	}
	var out []int64
	for attempt := 0; ; attempt++ {
		var err error
		out, err = rm.admitScript.Run(ctx, rm.c, keys, args...).Int64Slice()
		if err != nil {
			return states, nil, fmt.Errorf("%w: admit in Redis: %w", errMetersUnavailable, err)
		}
		if len(out) < 3 {
			return states, nil, fmt.Errorf("admit in Redis: the script answered %d values", len(out))
		}
		need := out[1]
		if need == 0 {
			break
		}
		if attempt == 2 {
			return states, nil, fmt.Errorf("%w: admit in Redis: the budgets' spend keys vanish as soon as set", errMetersUnavailable)
		}
		for i, h := range a.holders {
			if need&(1<<i) != 0 {
				if err := rm.initSpend(ctx, h, keys[5*i+3], keys[5*i+4], a.now); err != nil {
					return states, nil, err
				}
			}
		}
	}
	if len(out) != 3+7*len(a.holders) {
		return states, nil, fmt.Errorf("admit in Redis: the script answered %d values", len(out))
	}
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	for i := range a.holders {
		v := out[3+7*i:]
		states[i] = meterState{requestWait: us(v[0]), tokenWait: us(v[1]), concurrent: v[2] == 1, overBudget: v[3] == 1,
			requests: int(v[4]), tokens: int(v[5]), reset: us(v[6])}
	}
	if out[0] != 1 {
		return states, nil, nil
	}
	member := fmt.Sprintf("%s:%d:%d", id, a.tokens, a.micro)
	return states, func(usedTokens, usedMicro int64) {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		if err := rm.settleScript.Run(ctx, rm.c, keys, id, member, usedTokens, usedMicro, ttl).Err(); err != nil {
			// Its in-flight slot frees itself after the lease; its
			// window tokens stay at the bound.
			rm.log.Error("settle a request's limits in Redis", "tenant", a.holders[0].tenant, "key", a.holders[1].key, "err", err)
		}
	}, nil
}

// initSpend sets, unless another replica did first (SET NX), what h spent
// in the budget period holding now at the keys st and sm, read from the
// usage records; they live until a day after the period ends.
func (rm *redisMeters) initSpend(ctx context.Context, h holder, st, sm string, now time.Time) error {
	_, err, _ := rm.inits.Do(st, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		start := h.limits.periodStart(now)
		tokens, micro, err := rm.spend(ctx, h, start)
		if err != nil {
			return nil, err
		}
		ttl := h.limits.periodEnd(start).Sub(now) + 24*time.Hour
		pipe := rm.c.Pipeline()
		pipe.SetNX(ctx, st, tokens, ttl)
		pipe.SetNX(ctx, sm, micro, ttl)
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("%w: set the budget's spend of %s in Redis: %w", errMetersUnavailable, h.name, err)
		}
		return nil, nil
	})
	return err
}
