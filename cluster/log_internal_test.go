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
