package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
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
