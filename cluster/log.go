package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hclogToSlog receives raft's hclog output (one JSON object per line) and
// re-emits each line through slog, so a node has one structured log stream.
// A warning or error that repeats for the same peer (raft reports every
// failed heartbeat and append to a peer that is down, several times a
// second) is logged at its level once per raftRepeatWindow, and at debug in
// between.
type hclogToSlog struct {
	log *slog.Logger
	now func() time.Time // nil: time.Now

	mu      sync.Mutex
	repeats map[string]*repeat
}

// raftRepeatWindow is how often one kind of raft warning or error about
// one peer is logged at its level.
const raftRepeatWindow = 10 * time.Second

// repeat is when a raft line was last logged at its level, and how many
// times it came since.
type repeat struct {
	logged time.Time
	since  int
}

func (h *hclogToSlog) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimSpace(p), []byte{'\n'}) {
		var rec map[string]any
		if json.Unmarshal(line, &rec) != nil {
			h.log.Info(string(line))
			continue
		}
		level := slog.LevelInfo
		switch lv, _ := rec["@level"].(string); strings.ToLower(lv) {
		case "trace", "debug":
			level = slog.LevelDebug
		case "warn":
			level = slog.LevelWarn
		case "error":
			level = slog.LevelError
		}
		msg, _ := rec["@message"].(string)
		if level == slog.LevelError && routine(msg, rec["error"]) {
			level = slog.LevelDebug
		}
		attrs := []any{}
		for k, v := range rec {
			if !strings.HasPrefix(k, "@") {
				attrs = append(attrs, k, v)
			}
		}
		if level >= slog.LevelWarn {
			var repeated int
			if level, repeated = h.throttle(level, msg, rec); repeated > 0 {
				attrs = append(attrs, "repeated", repeated)
			}
		}
		h.log.Log(context.Background(), level, msg, attrs...)
	}
	return len(p), nil
}

// throttle returns the level to log a warning or error line at: its own
// the first time and once raftRepeatWindow has passed since it was last
// logged at it, with how many times it came in between; debug otherwise.
// A line is identified by its message and the peer it names.
func (h *hclogToSlog) throttle(level slog.Level, msg string, rec map[string]any) (slog.Level, int) {
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	key := fmt.Sprint(msg, "\x00", rec["peer"], "\x00", rec["target"], "\x00", rec["server-id"], "\x00", rec["from"])
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.repeats == nil {
		h.repeats = map[string]*repeat{}
	}
	t := now()
	r := h.repeats[key]
	if r == nil {
		h.repeats[key] = &repeat{logged: t}
		return level, 0
	}
	if t.Sub(r.logged) < raftRepeatWindow {
		r.since++
		return slog.LevelDebug, 0
	}
	n := r.since
	r.logged, r.since = t, 0
	return level, n
}

// raftLogLevel is the level raft logs at: its warnings and errors, and at
// debug also its progress lines (elections, state changes, snapshots); its
// per-RPC trace lines never.
func raftLogLevel(log *slog.Logger) hclog.Level {
	if log.Enabled(context.Background(), slog.LevelDebug) {
		return hclog.Debug
	}
	return hclog.Warn
}

// routine reports an error line that only says this node closed something
// itself: raft reading from a connection the node closed while stopping,
// autopilot's work cut short when leadership ends.
func routine(msg string, err any) bool {
	e, _ := err.(string)
	switch msg {
	case "failed to decode incoming command":
		return strings.HasSuffix(e, "use of closed network connection") || e == "transport shutdown"
	case "Error when computing next state":
		return e == context.Canceled.Error()
	}
	return false
}
