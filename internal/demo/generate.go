package demo

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// Sizes and shape of the generated data.
const (
	orderCount  = 3200
	ticketCount = 420
	// pendingWindow is how recent (in days before AsOf) an order must be to
	// still be pending.
	pendingWindow = 21
	// paymentTerms is the number of days between an invoice and its due date.
	paymentTerms = 30
	// maxPaymentAttempts matches the retry schedule of the failed payment
	// retries runbook: day 0, 3, 5 and 7.
	maxPaymentAttempts = 4
)

const (
	dateLayout     = "2006-01-02"
	dateTimeLayout = "2006-01-02 15:04:05"
)

var (
	// dataStart is the first day of generated orders and tickets.
	dataStart = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	// asOf is AsOf as a time; generated activity ends on this day.
	asOf = time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)
)

// customerNames are the demo customers, in id order. The first two are the
// ones demo playbooks name; the rest make the numbers look like a business.
var customerNames = []string{
	"Acme Corp", "Globex", "Initech", "Umbrella Corp", "Stark Industries",
	"Wayne Enterprises", "Hooli", "Soylent", "Cyberdyne", "Tyrell Corp",
	"Wonka Industries", "Oscorp", "Massive Dynamic", "Vandelay Industries", "Dunder Mifflin",
	"Pied Piper", "Aperture Science", "Black Mesa", "Monarch Solutions", "Nakatomi Trading",
	"Virtucon", "Gekko & Co", "Prestige Worldwide", "Bluth Company", "Sterling Cooper",
	"Wernham Hogg", "Los Pollos Hermanos", "Buy n Large", "Weyland-Yutani", "Oceanic Airlines",
	"Duff Brewing", "Krusty Krab", "Planet Express", "MomCorp", "Spacely Sprockets",
	"Cogswell Cogs", "Rekall", "Omni Consumer Products", "InGen", "Blue Sun",
	"Yoyodyne", "Zorg Industries", "Tessier-Ashpool", "Sirius Cybernetics", "Ollivanders",
	"Paper Street Soap", "Big Kahuna Burger", "Central Perk", "Bushwood Holdings", "Contoso",
	"Fabrikam", "Northwind Traders", "Tailspin Toys", "Wide World Importers", "Adventure Works",
	"Litware", "Proseware", "Woodgrove Bank", "Vehement Capital", "Kerbal Aerospace",
}

// fixedCustomers pins region and segment of the customers demo playbooks
// talk about, so their story does not depend on the random stream.
var fixedCustomers = map[string]struct{ region, segment string }{
	"Acme Corp": {"NA", "enterprise"},
	"Globex":    {"EMEA", "enterprise"},
}

// regions and segments with their share of customers and their effect on
// order sizes.
var (
	regions = []weighted[string]{
		{"NA", 35}, {"EMEA", 30}, {"APAC", 20}, {"LATAM", 15},
	}
	regionSpend = map[string]float64{"NA": 1.15, "EMEA": 1.0, "APAC": 0.9, "LATAM": 0.7}

	segments = []weighted[string]{
		{"enterprise", 20}, {"mid-market", 40}, {"smb", 40},
	}
	// segmentOrderSize is the median order amount in USD.
	segmentOrderSize = map[string]float64{"enterprise": 4200, "mid-market": 1300, "smb": 320}
	// segmentActivity is the relative number of orders and tickets.
	segmentActivity = map[string]float64{"enterprise": 5, "mid-market": 2.5, "smb": 1}

	priorities = []weighted[string]{
		{"low", 30}, {"normal", 45}, {"high", 18}, {"urgent", 7},
	}
)

// ticketSubjects are the subjects of generated support tickets.
var ticketSubjects = []string{
	"Cannot log in after password reset",
	"Invoice amount does not match order",
	"Request for refund",
	"API returns 429 Too Many Requests",
	"SSO configuration help",
	"Export to CSV times out",
	"Charged twice for the same order",
	"Update billing contact",
	"Data deletion request (GDPR)",
	"Webhook deliveries failing",
	"Dashboard loads slowly",
	"Add seats to subscription",
	"Order stuck in pending",
	"Wrong tax rate on invoice",
	"Update payment method",
	"Feature request: audit log export",
	"Lost MFA device",
	"Certificate error on custom domain",
	"Report is missing recent orders",
	"Downgrade plan at renewal",
	"Contract renewal question",
	"CRM integration stopped syncing",
	"Card payment declined",
	"Grant admin access to new colleague",
	"Cancel pending order",
}

// Ids of the customers demo playbooks name; they are the first two of
// customerNames.
const (
	acmeID   = 1
	globexID = 2
)

// plantedTicket is an open ticket every generation contains, so demo goals
// about a named customer's open tickets have a stable answer.
type plantedTicket struct {
	customerID        int64
	opened            time.Time
	priority, subject string
}

// plantedTickets are the only open tickets of Acme Corp (3) and Globex (2);
// generated tickets of these two customers are never open.
var plantedTickets = []plantedTicket{
	{acmeID, decemberAt(8, 9, 14), "urgent", "Card payment declined on latest invoice"},
	{acmeID, decemberAt(15, 16, 2), "high", "Payment retries failing for December orders"},
	{acmeID, decemberAt(22, 11, 37), "normal", "SSO login loop for new users"},
	{globexID, decemberAt(11, 8, 45), "high", "Request for refund on duplicate order"},
	{globexID, decemberAt(29, 14, 20), "normal", "Export to CSV times out"},
}

// decemberAt returns a time in December 2025, UTC.
func decemberAt(day, hour, minute int) time.Time {
	return time.Date(2025, 12, day, hour, minute, 0, 0, time.UTC)
}

// plantedFailedInvoices is how many of Acme Corp's most recent completed
// orders get an invoice that exhausted its payment retries, the starting
// point of the failed payment demo.
const plantedFailedInvoices = 2

type weighted[T any] struct {
	value  T
	weight float64
}

type customer struct {
	id              int64
	name            string
	region, segment string
	createdAt       time.Time
	activity        float64
}

type order struct {
	id, customerID int64
	day            time.Time
	amount         float64
	status         string
}

type invoice struct {
	id, orderID, customerID int64
	issued, due             time.Time
	amount                  float64
	status                  string
	attempts                int
}

type ticket struct {
	id, customerID   int64
	opened           time.Time
	closed           time.Time // zero unless status is closed
	status, priority string
	subject          string
}

// dataset is one complete generation of the demo rows.
type dataset struct {
	customers []customer
	orders    []order
	invoices  []invoice
	tickets   []ticket
}

// generator draws the dataset from one random stream; the order of the
// draws is part of the output, so keep it stable.
type generator struct {
	rng       *rand.Rand
	customers []customer
	// cumActivity holds the running sum of customers' activity, for
	// weighted picks.
	cumActivity []float64
}

// generate returns the demo dataset. It is a pure function of this file.
func generate() *dataset {
	g := &generator{rng: rand.New(rand.NewPCG(1, 2))}
	g.genCustomers()
	orders := g.genOrders()
	invoices := g.genInvoices(orders)
	tickets := g.genTickets()
	return &dataset{customers: g.customers, orders: orders, invoices: invoices, tickets: tickets}
}

func (g *generator) genCustomers() {
	span := int(dataStart.Sub(time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)).Hours() / 24)
	total := 0.0
	for i, name := range customerNames {
		c := customer{id: int64(i + 1), name: name}
		if fixed, ok := fixedCustomers[name]; ok {
			c.region, c.segment = fixed.region, fixed.segment
		} else {
			c.region = pick(g.rng, regions)
			c.segment = pick(g.rng, segments)
		}
		c.createdAt = dataStart.AddDate(0, 0, -1-g.rng.IntN(span))
		c.activity = segmentActivity[c.segment] * (0.6 + 0.8*g.rng.Float64())
		total += c.activity
		g.customers = append(g.customers, c)
		g.cumActivity = append(g.cumActivity, total)
	}
}

// pickCustomer returns a customer with probability proportional to its
// activity.
func (g *generator) pickCustomer() *customer {
	x := g.rng.Float64() * g.cumActivity[len(g.cumActivity)-1]
	i := sort.SearchFloat64s(g.cumActivity, x)
	return &g.customers[min(i, len(g.customers)-1)]
}

// randomDay returns a day between dataStart and asOf, both included.
func (g *generator) randomDay() time.Time {
	days := int(asOf.Sub(dataStart).Hours()/24) + 1
	return dataStart.AddDate(0, 0, g.rng.IntN(days))
}

func daysBetween(from, to time.Time) int {
	return int(to.Sub(from).Hours() / 24)
}

func (g *generator) genOrders() []order {
	orders := make([]order, 0, orderCount)
	for range orderCount {
		c := g.pickCustomer()
		o := order{customerID: c.id, day: g.randomDay(), status: "completed"}
		size := segmentOrderSize[c.segment] * regionSpend[c.region] * math.Exp(0.45*g.rng.NormFloat64())
		if o.day.Year() == 2025 {
			size *= 1.08 // the company grew
		}
		o.amount = math.Round(size*100) / 100
		switch r := g.rng.Float64(); {
		case daysBetween(o.day, asOf) < pendingWindow && r < 0.5:
			o.status = "pending"
		case r > 0.96:
			o.status = "refunded"
		}
		orders = append(orders, o)
	}
	slices.SortStableFunc(orders, func(a, b order) int { return a.day.Compare(b.day) })
	for i := range orders {
		orders[i].id = int64(i + 1)
	}
	return orders
}

func (g *generator) genInvoices(orders []order) []invoice {
	invoices := make([]invoice, 0, len(orders))
	for _, o := range orders {
		inv := invoice{
			id: o.id, orderID: o.id, customerID: o.customerID,
			issued: o.day, due: o.day.AddDate(0, 0, paymentTerms),
			amount: o.amount, status: "paid", attempts: 1,
		}
		switch {
		case o.status == "pending":
			inv.status, inv.attempts = "open", 0
		case o.status == "refunded":
		case g.rng.Float64() < 0.92:
			// Most cards go through at once; some after a retry or two.
			if r := g.rng.Float64(); r > 0.95 {
				inv.attempts = 3
			} else if r > 0.85 {
				inv.attempts = 2
			}
		case !inv.due.Before(asOf):
			// Still within terms: the retry schedule is running.
			inv.status, inv.attempts = "open", 1+g.rng.IntN(maxPaymentAttempts-1)
		case daysBetween(inv.due, asOf) > 90 && g.rng.Float64() < 0.8:
			// Long ago: dunning recovered most of them eventually.
			inv.attempts = 2 + g.rng.IntN(maxPaymentAttempts-1)
		case g.rng.Float64() < 0.5:
			inv.status, inv.attempts = "failed", maxPaymentAttempts
		default:
			// Paid by bank transfer, which has no card attempts, and late.
			inv.status, inv.attempts = "overdue", 0
		}
		invoices = append(invoices, inv)
	}
	plantFailedInvoices(orders, invoices)
	return invoices
}

// plantFailedInvoices marks the invoices of Acme Corp's latest completed
// orders as failed after every retry.
func plantFailedInvoices(orders []order, invoices []invoice) {
	planted := 0
	for i := len(orders) - 1; i >= 0 && planted < plantedFailedInvoices; i-- {
		if orders[i].customerID != acmeID || orders[i].status != "completed" {
			continue
		}
		invoices[i].status, invoices[i].attempts = "failed", maxPaymentAttempts
		planted++
	}
}

func (g *generator) genTickets() []ticket {
	tickets := make([]ticket, 0, ticketCount+len(plantedTickets))
	for range ticketCount {
		c := g.pickCustomer()
		t := ticket{
			customerID: c.id,
			opened:     g.randomDay().Add(time.Duration(7*3600+g.rng.IntN(11*3600)) * time.Second),
			priority:   pick(g.rng, priorities),
			subject:    ticketSubjects[g.rng.IntN(len(ticketSubjects))],
		}
		t.status = g.ticketStatus(daysBetween(t.opened, asOf))
		if t.status == "closed" {
			t.closed = t.opened.Add(time.Duration(1800+g.rng.IntN(14*24*3600)) * time.Second)
			if t.closed.After(asOf.AddDate(0, 0, 1)) {
				t.status, t.closed = "pending", time.Time{}
			}
		}
		if _, ok := fixedCustomers[c.name]; ok && t.status == "open" {
			t.status = "pending" // their open tickets are the planted ones
		}
		tickets = append(tickets, t)
	}
	for _, p := range plantedTickets {
		tickets = append(tickets, ticket{
			customerID: p.customerID, opened: p.opened,
			status: "open", priority: p.priority, subject: p.subject,
		})
	}
	slices.SortStableFunc(tickets, func(a, b ticket) int { return a.opened.Compare(b.opened) })
	for i := range tickets {
		tickets[i].id = int64(i + 1)
	}
	return tickets
}

// ticketStatus draws the status of a ticket opened age days before asOf:
// recent tickets are often still open, old ones almost always closed.
func (g *generator) ticketStatus(age int) string {
	r := g.rng.Float64()
	switch {
	case age < 14 && r < 0.45, age < 45 && r < 0.10:
		return "open"
	case age < 14 && r < 0.75, age < 45 && r < 0.25, r < 0.02:
		return "pending"
	default:
		return "closed"
	}
}

// pick returns one of the choices with probability proportional to weight.
func pick[T any](rng *rand.Rand, choices []weighted[T]) T {
	total := 0.0
	for _, c := range choices {
		total += c.weight
	}
	x := rng.Float64() * total
	for _, c := range choices {
		if x < c.weight {
			return c.value
		}
		x -= c.weight
	}
	return choices[len(choices)-1].value
}

// insert writes the dataset and the meta rows through tx.
func (d *dataset) insert(ctx context.Context, tx *sql.Tx, dl dialect) error {
	meta := [][]any{
		{"schema_version", SchemaVersion},
		{"as_of", AsOf},
		{"currency", "USD"},
		{"description", "planex demo company: customers, orders, invoices and support tickets, generated deterministically"},
	}
	customers := make([][]any, 0, len(d.customers))
	for _, c := range d.customers {
		customers = append(customers, []any{c.id, c.name, c.region, c.segment, c.createdAt.Format(dateLayout)})
	}
	orders := make([][]any, 0, len(d.orders))
	for _, o := range d.orders {
		orders = append(orders, []any{o.id, o.customerID, o.day.Format(dateLayout), o.amount, o.status})
	}
	invoices := make([][]any, 0, len(d.invoices))
	for _, i := range d.invoices {
		invoices = append(invoices, []any{i.id, i.orderID, i.customerID,
			i.issued.Format(dateLayout), i.due.Format(dateLayout), i.amount, i.status, i.attempts})
	}
	tickets := make([][]any, 0, len(d.tickets))
	for _, t := range d.tickets {
		var closed any // NULL unless closed
		if !t.closed.IsZero() {
			closed = t.closed.Format(dateTimeLayout)
		}
		tickets = append(tickets, []any{t.id, t.customerID, t.opened.Format(dateTimeLayout), closed, t.status, t.priority, t.subject})
	}
	for _, table := range []struct {
		insert string
		rows   [][]any
	}{
		{`INSERT INTO meta (key, value) VALUES (?, ?)`, meta},
		{`INSERT INTO customers (id, name, region, segment, created_at) VALUES (?, ?, ?, ?, ?)`, customers},
		{`INSERT INTO orders (id, customer_id, ordered_at, amount, status) VALUES (?, ?, ?, ?, ?)`, orders},
		{`INSERT INTO invoices (id, order_id, customer_id, issued_at, due_at, amount, status, payment_attempts)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, invoices},
		{`INSERT INTO support_tickets (id, customer_id, opened_at, closed_at, status, priority, subject)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, tickets},
	} {
		if err := insertRows(ctx, tx, dl.bind(table.insert), table.rows); err != nil {
			return err
		}
	}
	return nil
}

// insertRows runs one prepared INSERT per row.
func insertRows(ctx context.Context, tx *sql.Tx, query string, rows [][]any) (err error) {
	stmt, err := tx.PrepareContext(ctx, query)
	if err != nil {
		return fmt.Errorf("prepare %q: %w", query, err)
	}
	defer func() {
		if cerr := stmt.Close(); err == nil {
			err = cerr
		}
	}()
	for _, row := range rows {
		if _, err := stmt.ExecContext(ctx, row...); err != nil {
			return fmt.Errorf("%q %v: %w", query, row, err)
		}
	}
	return nil
}
