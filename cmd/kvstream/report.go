package main

import (
	"encoding/json"
	"io"
)

// textReport is a command's report that also writes itself for people.
type textReport interface{ Text(w io.Writer) }

// printReport writes a command's report to w: with asJSON, as one indented
// JSON object; else as its text, then what more adds for people (the
// sim's key metrics).
func printReport(w io.Writer, asJSON bool, rep textReport, more ...func(io.Writer)) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Text(w)
	for _, f := range more {
		f(w)
	}
	return nil
}
