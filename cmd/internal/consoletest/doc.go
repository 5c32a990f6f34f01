// Package consoletest tests the web console (services/console) in a real
// headless Chromium, driven with chromedp, against an in-process dev stack
// (cmd/internal/devstack): TLS, API key authentication, the demo playbooks
// and real executor pools. It checks the pages with axe-core and writes
// screenshots to $PLANEX_ARTIFACTS (docs/console.md links copies of them).
//
// The test skips with a message naming what is missing when no Chromium
// (PLANEX_TEST_CHROMIUM or chromium on PATH) or no axe-core
// (PLANEX_TEST_AXE, or ~/.cache/planex/axe) is installed; .ci/run
// installs both.
package consoletest
