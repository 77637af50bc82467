package api

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// Every code the server can answer with has its status in the one table
// and is documented; only the server's own failures are 5xx.
func TestEveryErrorCodeHasAStatusAndIsDocumented(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs: %v %v", docs, err)
	}
	var all strings.Builder
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	// The 5xx answers: a bug, a cluster that cannot serve now, and a
	// coordinator whose peers (other islands) did not answer.
	server := map[string]bool{errcode.Internal.Code: true,
		errcode.TxnFanoutFailed.Code: true, errcode.TCRMReplication.Code: true}
	codes := errcode.All()
	if len(codes) < 50 {
		t.Fatalf("only %d codes registered", len(codes))
	}
	for _, c := range codes {
		s, ok := statusOf[c]
		switch {
		case !ok:
			t.Errorf("%s has no HTTP status (it would answer 500)", c)
		case s >= 500 && s != http.StatusServiceUnavailable && !server[c]:
			t.Errorf("%s answers %d", c, s)
		}
		if !regexp.MustCompile(`\b` + c + `\b`).MatchString(all.String()) {
			t.Errorf("%s is not in docs/", c)
		}
	}
}
