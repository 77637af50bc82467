package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogToSlog receives raft's hclog output (one JSON object per line) and
// re-emits each line through slog, so a node has one structured log stream.
type hclogToSlog struct{ log *slog.Logger }

func (h hclogToSlog) Write(p []byte) (int, error) {
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
		h.log.Log(context.Background(), level, msg, attrs...)
	}
	return len(p), nil
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
