package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
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

// heartbeatFailure is the line raft logs, several times a second, while
// peer does not answer.
func heartbeatFailure(peer string) string {
	return `{"@level":"error","@message":"failed to heartbeat to","peer":"` + peer + `","error":"dial tcp ` + peer + `: connect: connection refused"}` + "\n"
}

// levelsOf writes lines to h and returns the level of each line logged.
func levelsOf(t *testing.T, out *bytes.Buffer, h io.Writer, lines ...string) []string {
	t.Helper()
	out.Reset()
	for _, l := range lines {
		if _, err := h.Write([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	var levels []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		levels = append(levels, strings.TrimPrefix(strings.Fields(l)[1], "level="))
	}
	return levels
}

// TestRepeatedRaftFailuresAreLoggedOncePerWindow: a peer that is down
// makes raft report each failed heartbeat and append, several times a
// second, until the peer returns or is removed. The first failure of each
// kind for each peer is logged at its level, the repeats within
// raftRepeatWindow at debug.
func TestRepeatedRaftFailuresAreLoggedOncePerWindow(t *testing.T) {
	var out bytes.Buffer
	h := &hclogToSlog{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	appendFailure := `{"@level":"error","@message":"failed to appendEntries to","peer":{"Address":"127.0.0.1:3","ID":"n3"},"error":"refused"}` + "\n"
	got := levelsOf(t, &out, h, heartbeatFailure("127.0.0.1:3"), heartbeatFailure("127.0.0.1:3"), heartbeatFailure("127.0.0.1:4"),
		appendFailure, heartbeatFailure("127.0.0.1:3"), appendFailure, heartbeatFailure("127.0.0.1:4"))
	want := []string{"ERROR", "DEBUG", "ERROR", "ERROR", "DEBUG", "DEBUG", "DEBUG"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("levels %v, want %v\n%s", got, want, out.String())
	}
}

// TestRaftFailuresAreLoggedAgainAfterTheWindow: once raftRepeatWindow has
// passed, the next failure is logged at its level again, with the number
// of repeats logged at debug since the last one.
func TestRaftFailuresAreLoggedAgainAfterTheWindow(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1000, 0)
	h := &hclogToSlog{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})),
		now: func() time.Time { return now }}
	var lines []string
	for range 12 {
		lines = append(lines, heartbeatFailure("127.0.0.1:3"))
	}
	levelsOf(t, &out, h, lines...)
	now = now.Add(raftRepeatWindow)
	if got := levelsOf(t, &out, h, heartbeatFailure("127.0.0.1:3")); got[0] != "ERROR" || !strings.Contains(out.String(), "repeated=11") {
		t.Fatalf("after the window: %s, want an error counting the 11 repeats", out.String())
	}
}
