package sweeper

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/leaderloop"
)

// ForgettableKeys lists key records that hold nothing but their fencing
// counters (fsm.View.ForgettableKeys), from the leader's own state.
type ForgettableKeys interface {
	ForgettableKeys(after []byte, limit, scan int) (keys []fsm.KeyName, next []byte, err error)
}

// Upgrade tells whether every server of the configuration applies this
// build's commands; until then nothing is forgotten, since an older build
// would stop at the command.
type Upgrade interface {
	EveryServerApplies() bool
}

// ForgetConfig bounds the forgetter's work.
type ForgetConfig struct {
	Interval time.Duration // pause between steps of the walk that fill no entry
	Scan     int           // key records looked at per step
	Limit    int           // keys per forget_keys entry
	Logger   *slog.Logger
}

// Forgetter walks the key records on the leader, a bounded step at a time,
// and proposes forget_keys for those that hold nothing but their fencing
// counters, so that the state grows with the keys in use rather than with
// every key ever used. The state machine checks each key again when it
// applies the entry, so a key acquired since the walk saw it is kept.
type Forgetter struct {
	proposer Proposer
	keys     ForgettableKeys
	upgrade  Upgrade
	cfg      ForgetConfig

	leaderloop.Loop
	forgotten atomic.Int64
}

// NewForgetter returns a stopped forgetter.
func NewForgetter(p Proposer, keys ForgettableKeys, upgrade Upgrade, cfg ForgetConfig) *Forgetter {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Scan <= 0 {
		cfg.Scan = 8192
	}
	if cfg.Limit <= 0 || cfg.Limit > fsm.MaxForget {
		cfg.Limit = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Forgetter{proposer: p, keys: keys, upgrade: upgrade, cfg: cfg}
}

// SetLeader starts the forgetter when this node gains leadership and stops
// it when leadership is lost. It does not block.
func (f *Forgetter) SetLeader(isLeader bool) { f.Set(isLeader, f.run) }

// Forgotten counts the key records forgotten by this node's entries.
func (f *Forgetter) Forgotten() int64 { return f.forgotten.Load() }

func (f *Forgetter) run(ctx context.Context) {
	var after []byte
	for {
		full := false
		if f.upgrade.EveryServerApplies() {
			keys, next, err := f.keys.ForgettableKeys(after, f.cfg.Limit, f.cfg.Scan)
			if err == nil && len(keys) > 0 {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				var res *fsm.Result
				res, err = f.proposer.Propose(pctx, &fsm.Command{Op: fsm.OpForgetKeys, ForgetKeys: &fsm.ForgetKeysCmd{Keys: keys}})
				cancel()
				if err == nil {
					f.forgotten.Add(int64(res.Forgotten))
				}
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				f.cfg.Logger.Warn("forgetting unused keys failed", "error", err)
			} else {
				after, full = next, len(keys) == f.cfg.Limit
			}
		}
		// A full entry suggests more of the same: the walk goes on at once.
		if !full && !sleep(ctx, f.cfg.Interval) {
			return
		}
	}
}
