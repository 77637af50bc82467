package rm_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/api"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// rejected checks that err is a coded rejection the API answers with 400.
func rejected(t *testing.T, what, in string, err error) {
	t.Helper()
	var e *errcode.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s(%q): error without a code: %v", what, in, err)
	}
	if s := api.StatusOf(e.Code); s != http.StatusBadRequest {
		t.Fatalf("%s(%q): code %s answers %d, want 400", what, in, e.Code, s)
	}
}

func printableName(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// FuzzNames runs every name and identifier validator of the services on
// arbitrary input: nothing panics, a rejection is a 400 with a stable code,
// and what is accepted is normalised for good (validating it again changes
// nothing) and fits the state file's layout (no NUL, bounded length).
func FuzzNames(f *testing.F) {
	for _, s := range []string{"", "default", " Orders ", "Orders", "\u0130", "\u212a", ".txns", "a.b_c-d", strings.Repeat("n", 129), "ns\x00x",
		"k", "q/orders/state/1", "ключ", "\xff\xfe", "tab\there", strings.Repeat("k", 513),
		"orders", "orders.dlq", "Q-1_x", strings.Repeat("q", 128) + ".dlq", strings.Repeat("q", 129) + ".dlq", ".hidden", xid.New().String(), "9m4e2mr0ui3e8a215n4h", "9M4E2MR0UI3E8A215N4G",
		"backend/1", "island a", "h1", strings.Repeat("0", 64), strings.Repeat("g", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ns, err := rm.Namespace(s); err != nil {
			rejected(t, "Namespace", s, err)
		} else {
			if again, err := rm.Namespace(ns); err != nil || again != ns {
				t.Fatalf("Namespace(%q) = %q, which validates as %q, %v", s, ns, again, err)
			}
			if s == "" && ns != wire.DefaultNamespace {
				t.Fatalf("Namespace(%q) = %q, want the default namespace", s, ns)
			}
			// Only A-Z changes, to a-z; nothing else is accepted.
			if s != "" && ns != strings.ToLower(s) || ns == "" || len(ns) > 128 || strings.HasPrefix(ns, ".") ||
				strings.Trim(ns, "abcdefghijklmnopqrstuvwxyz0123456789._-") != "" {
				t.Fatalf("Namespace(%q) accepted %q", s, ns)
			}
		}
		if key, err := rm.Key(s); err != nil {
			rejected(t, "Key", s, err)
		} else if key != s || key == "" || len(key) > 512 || !printableName(key) {
			t.Fatalf("Key(%q) accepted %q", s, key)
		}
		if _, _, err := rm.Resource(s, s); err != nil {
			rejected(t, "Resource", s, err)
		}
		if q, err := rm.QueueName(s); err != nil {
			rejected(t, "QueueName", s, err)
		} else {
			if again, err := rm.QueueName(q); err != nil || again != q {
				t.Fatalf("QueueName(%q) = %q, which validates as %q, %v", s, q, again, err)
			}
			// Only a dead-letter queue is longer than 128 characters.
			if q == "" || len(q) > 128 && (len(q) > 132 || !strings.HasSuffix(q, wire.DeadLetterSuffix)) || q[0] == '.' ||
				strings.ContainsAny(q, "/\x00 ") {
				t.Fatalf("QueueName(%q) accepted %q", s, q)
			}
			// The dead letter queue of a queue messages can be sent to
			// can be consumed.
			if len(q) <= 128 {
				if _, err := rm.QueueName(q + wire.DeadLetterSuffix); err != nil {
					t.Fatalf("dead letter queue of %q: %v", q, err)
				}
			}
		}
		if _, _, err := rm.QueueRef(s, s); err != nil {
			rejected(t, "QueueRef", s, err)
		}
		if id, err := rm.TxnID(s); err != nil {
			rejected(t, "TxnID", s, err)
		} else if x, err := xid.FromString(id); err != nil || x.String() != id {
			t.Fatalf("TxnID accepted %q, which is not a canonical xid (%v)", id, err)
		}
		if id, err := rm.LeaseID(s); err != nil {
			rejected(t, "LeaseID", s, err)
		} else if x, err := xid.FromString(id); err != nil || x.String() != id {
			t.Fatalf("LeaseID accepted %q, which is not a canonical xid (%v)", id, err)
		}
		if b, err := rm.BackendHash(s); err != nil {
			rejected(t, "BackendHash", s, err)
		} else {
			if again, err := rm.BackendHash(b); err != nil || again != b {
				t.Fatalf("BackendHash(%q) = %q, which validates as %q, %v", s, b, again, err)
			}
			if len(b) > 128 || strings.ContainsAny(b, " /\x00") || !printableName(b) {
				t.Fatalf("BackendHash(%q) accepted %q", s, b)
			}
		}
		if rm.ValidSHA256(s) && (len(s) != 64 || strings.Trim(strings.ToLower(s), "0123456789abcdef") != "") {
			t.Fatalf("ValidSHA256 accepted %q", s)
		}
		ps, err := rm.Participants([]fsm.Participant{{Namespace: s, Key: s, Backend: s}, {Key: s}}, "self")
		if err != nil {
			var e *errcode.Error
			if !errors.As(err, &e) || api.StatusOf(e.Code)/100 != 4 {
				t.Fatalf("Participants(%q): %v", s, err)
			}
			return
		}
		for _, p := range ps {
			if p.Namespace == "" || p.Key == "" || p.Backend == "" {
				t.Fatalf("Participants(%q) returned %+v", s, p)
			}
			if _, _, err := rm.Resource(p.Namespace, p.Key); err != nil {
				t.Fatalf("Participants(%q) returned %+v, which does not validate: %v", s, p, err)
			}
		}
		if ref, err := (rm.LeaseRef{Namespace: s, Key: s, LeaseID: s, TxnID: s}).Validate(true); err == nil {
			if ref.Namespace == "" || ref.Key == "" || ref.LeaseID == "" || ref.TxnID == "" {
				t.Fatalf("LeaseRef of %q validated as %+v", s, ref)
			}
		} else {
			rejected(t, "LeaseRef.Validate", s, err)
		}
	})
}
