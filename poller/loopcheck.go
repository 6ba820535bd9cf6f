package poller

import (
	"fmt"
	"slices"
)

// Bounds of loopCheck: a listing that goes on handing out fresh page tokens
// while it lists nothing new is endless, and a pass must not read it
// forever (ErrEndlessListing).
const (
	// MaxEmptyPagesInRow is how many empty pages in a row, each with a
	// next page token, end a pass.
	MaxEmptyPagesInRow = 100
	// A run of pages that list only operations already listed (on the
	// pass's first page, or on one of the loopWindow pages before) ends a
	// pass once it holds at least minLoopPages pages and minLoopOps
	// operations: a handful of repeats across a page boundary is what a
	// listing that shifts under new batches shows, not a loop.
	minLoopPages = 3
	minLoopOps   = 100
	loopWindow   = 16
)

// loopCheck follows one pass's pages for an endless listing that fresh page
// tokens hide from the repeated-token check: a proxy that drops the
// pageToken parameter gets the first page again and again, each time with
// the token the API mints for it, which may differ every time. It keeps
// the operation names of the first page and of the last loopWindow pages,
// so its memory is bounded by the page size, not by the listing.
type loopCheck struct {
	pages    []map[string]bool // the first non-empty page's names, then the last loopWindow pages'
	empty    int               // empty pages in a row
	runPages int               // pages in a row that listed nothing new
	runOps   int               // operations on them
}

// page takes the operations of the next page that came with a next page
// token, and returns an error once the listing has shown itself endless.
func (c *loopCheck) page(ops []Operation) error {
	if len(ops) == 0 {
		if c.empty++; c.empty >= MaxEmptyPagesInRow {
			return fmt.Errorf("%w: %d empty pages in a row, each with a new page token", ErrEndlessListing, c.empty)
		}
		return nil
	}
	c.empty = 0
	names, seen := make(map[string]bool, len(ops)), len(c.pages) > 0
	for _, op := range ops {
		names[op.Name] = true
		seen = seen && slices.ContainsFunc(c.pages, func(p map[string]bool) bool { return p[op.Name] })
	}
	if seen {
		c.runPages++
		c.runOps += len(ops)
	} else {
		c.runPages, c.runOps = 0, 0
	}
	if len(c.pages) > loopWindow {
		c.pages = slices.Delete(c.pages, 1, 2)
	}
	c.pages = append(c.pages, names)
	if c.runPages >= minLoopPages && c.runOps >= minLoopOps {
		return fmt.Errorf("%w: %d pages in a row (%d operations) listed only operations this pass had already listed, each with a new page token (a proxy or gateway that drops the pageToken query parameter does this)",
			ErrEndlessListing, c.runPages, c.runOps)
	}
	return nil
}
