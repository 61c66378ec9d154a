package launch

import (
	"bufio"
	"io"

	"github.com/kvstream/kvstream/lab/service"
)

// ReadCommands reads a node's stdin, r, line by line onto the channel it
// returns (the "run BATCH DECODE" commands of a prefill rank) until r
// ends; then it closes the channel and starts the node's drain
// (sd.Trigger): a supervisor ends a node by closing its stdin. A second
// stop (sd.Hard) stops the handing over of lines.
func ReadCommands(r io.Reader, sd *service.Shutdown) <-chan string {
	lines := make(chan string)
	go readLines(r, sd, lines)
	return lines
}

// DrainAtEOF reads and drops a node's stdin, r, until it ends, then starts
// the node's drain (sd.Trigger): a node that takes no commands (a decode
// instance) still ends when its supervisor closes its stdin.
func DrainAtEOF(r io.Reader, sd *service.Shutdown) { go readLines(r, sd, nil) }

// readLines hands r's lines to lines (nil: drops them) until r ends, then
// triggers sd.
func readLines(r io.Reader, sd *service.Shutdown, lines chan<- string) {
	if lines != nil {
		defer close(lines)
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if lines == nil {
			continue
		}
		select {
		case lines <- sc.Text():
		case <-sd.Hard().Done():
			return
		}
	}
	sd.Trigger("stdin closed")
}
