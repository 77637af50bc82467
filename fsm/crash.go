package fsm

import (
	"encoding/json"
	"fmt"
	"os"
)

// MarkCrashed leaves the marker of the closed state file at path as a
// process killed while the file was open leaves it: not closed cleanly, by
// the running boot, so the next Open keeps the file. With rebooted the
// marker names another boot, as after a power loss, and the next Open
// discards the file, to be rebuilt from the snapshot and the Raft log.
// Tests use it to model crashes.
func MarkCrashed(path string, rebooted bool) error {
	raw, err := os.ReadFile(markerPath(path))
	if err != nil {
		return fmt.Errorf("fsm: read marker: %w", err)
	}
	var m marker
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("fsm: read marker: %w", err)
	}
	m.Clean = false
	if rebooted {
		m.BootID = "before-reboot-" + m.BootID
	}
	return writeMarker(path, m)
}
