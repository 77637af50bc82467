package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestRaftLogLinesKeepTheirLevelUnlessRoutine(t *testing.T) {
	var out bytes.Buffer
	h := hclogToSlog{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, line := range []string{
		`{"@level":"error","@message":"failed to decode incoming command","error":"read tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection"}`,
		`{"@level":"error","@message":"failed to decode incoming command","error":"transport shutdown"}`,
		`{"@level":"error","@message":"Error when computing next state","error":"context canceled"}`,
		`{"@level":"error","@message":"failed to decode incoming command","error":"read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"}`,
		`{"@level":"error","@message":"failed to appendEntries to","error":"dial tcp 127.0.0.1:3: connect: connection refused"}`,
		`{"@level":"warn","@message":"heartbeat timeout reached"}`,
	} {
		if _, err := h.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	var levels []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(l)
		levels = append(levels, strings.TrimPrefix(f[1], "level="))
	}
	want := []string{"DEBUG", "DEBUG", "DEBUG", "ERROR", "ERROR", "WARN"}
	if strings.Join(levels, " ") != strings.Join(want, " ") {
		t.Fatalf("levels %v, want %v\n%s", levels, want, out.String())
	}
}

// TestRaftInfoLinesFollowTheLogLevel: raft's own progress lines (elections,
// state changes) reach a node's log at --log-level debug, and stay out of
// it at info.
func TestRaftInfoLinesFollowTheLogLevel(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  bool
	}{{slog.LevelDebug, true}, {slog.LevelInfo, false}} {
		// The handler serialises its writes; the buffer is read once the
		// node has stopped.
		var out bytes.Buffer
		cfg := testConfig(t.TempDir(), "boot-a")
		cfg.Logger = slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: tc.level}))
		n := open(t, cfg)
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out.String(), "entering leader state"); got != tc.want {
			t.Errorf("at level %s, raft's \"entering leader state\" logged: %v, want %v\n%s", tc.level, got, tc.want, out.String())
		}
	}
}
