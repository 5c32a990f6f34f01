package monitoring

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/promql"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Picture sizes, in points (1/72 in) at 96 dpi: 1350 pt is 1800 px.
const (
	pictureWidth  = vg.Length(1350)
	headerHeight  = vg.Length(52)
	tileHeight    = vg.Length(280)
	legendHeight  = vg.Length(72)
	legendRows    = 5
	legendMaxText = 50
)

// palette is Grafana's classic series palette.
var palette = []color.RGBA{
	{0x73, 0xbf, 0x69, 0xff}, {0xf2, 0xcc, 0x0c, 0xff}, {0x8a, 0xb8, 0xff, 0xff}, {0xff, 0x78, 0x0a, 0xff},
	{0xf2, 0x49, 0x5c, 0xff}, {0x57, 0x94, 0xf2, 0xff}, {0xb8, 0x77, 0xd9, 0xff}, {0x70, 0x5d, 0xa0, 0xff},
	{0x37, 0x87, 0x2d, 0xff}, {0xfa, 0xde, 0x2a, 0xff},
}

var (
	inkColor   = color.RGBA{0x20, 0x22, 0x26, 0xff}
	faintColor = color.RGBA{0x6e, 0x72, 0x7a, 0xff}
	frameColor = color.RGBA{0xd8, 0xd9, 0xdc, 0xff}
)

func textStyle(size vg.Length, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(plot.DefaultFont, size), Handler: plot.DefaultTextHandler}
}

// RenderPNG draws a dashboard's evaluated panels as a grid of line
// charts, two per row as the dashboards lay them out, under a header
// with title and subtitle, and writes the PNG to w.
func RenderPNG(w io.Writer, title, subtitle string, panels []PanelData, win Window) error {
	const cols = 2
	rows := (len(panels) + cols - 1) / cols
	height := headerHeight + tileHeight*vg.Length(rows)
	img := vgimg.NewWith(vgimg.UseWH(pictureWidth, height), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	dc.FillText(textStyle(16, inkColor), vg.Point{X: 14, Y: height - 24}, title)
	dc.FillText(textStyle(9, faintColor), vg.Point{X: 14, Y: height - 42}, subtitle)

	body := draw.Crop(dc, 0, 0, 0, -headerHeight)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: 12, PadY: 12, PadLeft: 10, PadRight: 10, PadBottom: 8}
	for i, p := range panels {
		if err := drawPanel(tiles.At(body, i%cols, i/cols), p, win); err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("write png: %w", err)
	}
	return nil
}

func drawPanel(c draw.Canvas, pd PanelData, win Window) error {
	c.StrokeLines(draw.LineStyle{Color: frameColor, Width: 1}, []vg.Point{
		c.Min, {X: c.Max.X, Y: c.Min.Y}, c.Max, {X: c.Min.X, Y: c.Max.Y}, c.Min,
	})
	inner := draw.Crop(c, 4, -6, 4, -4)
	plotArea := draw.Crop(inner, 0, 0, legendHeight, 0)
	legendArea := draw.Crop(inner, 8, 0, 0, -(inner.Max.Y - inner.Min.Y - legendHeight))

	title := textStyle(13, inkColor)
	c.FillText(title, vg.Point{X: c.Min.X + 10, Y: c.Max.Y - 18}, pd.Title)
	plotArea = draw.Crop(plotArea, 0, 0, 0, -24)

	p := plot.New()
	p.X.Min, p.X.Max = float64(win.Start.Unix()), float64(win.End.Unix())
	p.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05"}
	p.Y.Tick.Marker = unitTicks(pd.Unit)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Tick.Label = textStyle(9.5, faintColor)
		a.LineStyle.Color = frameColor
		a.Tick.LineStyle.Color = frameColor
	}
	grid := plotter.NewGrid()
	grid.Vertical.Color, grid.Horizontal.Color = color.RGBA{0xee, 0xee, 0xf0, 0xff}, color.RGBA{0xee, 0xee, 0xf0, 0xff}
	p.Add(grid)

	// Fills first, then lines: a series' fill must not hide the lines
	// of the series drawn before it.
	var fills, lines []plot.Plotter
	legend := make([]legendEntry, 0, len(pd.Series))
	ymax := 0.0
	for i, s := range pd.Series {
		style := draw.LineStyle{Color: palette[i%len(palette)], Width: vg.Points(1.5)}
		if i >= len(palette) {
			style.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		for _, seg := range segments(s.Points, win.Step) {
			ymax = math.Max(ymax, maxY(seg))
			if len(seg) == 1 {
				sc, err := plotter.NewScatter(seg)
				if err != nil {
					return err
				}
				sc.GlyphStyle = draw.GlyphStyle{Color: style.Color, Radius: vg.Points(1.8), Shape: draw.CircleGlyph{}}
				lines = append(lines, sc)
				continue
			}
			fill, err := plotter.NewLine(seg)
			if err != nil {
				return err
			}
			fill.LineStyle.Width = 0
			fill.FillColor = translucent(style.Color)
			l, err := plotter.NewLine(seg)
			if err != nil {
				return err
			}
			l.LineStyle = style
			fills, lines = append(fills, fill), append(lines, l)
		}
		legend = append(legend, legendEntry{text: trimLegend(s.Legend), style: style})
	}
	p.Add(fills...)
	p.Add(lines...)
	p.Y.Min, p.Y.Max = 0, ymax*1.12
	switch {
	case len(pd.Series) == 0:
		p.Y.Max = 1
		p.Y.Tick.Marker = plot.ConstantTicks(nil)
	case ymax <= 0:
		p.Y.Max = 1
	}
	p.Draw(plotArea)
	if pd.NoData != "" {
		da := p.DataCanvas(plotArea)
		sty := textStyle(10, faintColor)
		sty.XAlign = draw.XCenter
		for i, line := range wrap(pd.NoData, 64) {
			da.FillText(sty, vg.Point{X: (da.Min.X + da.Max.X) / 2, Y: (da.Min.Y+da.Max.Y)/2 - vg.Length(i)*13}, line)
		}
	}
	drawLegend(legendArea, legend)
	return nil
}

// translucent is a series colour at Grafana's 10 % fill opacity.
func translucent(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 0x1a}
}

// segments splits points where samples are missing (a gap longer than
// one and a half steps), as Grafana breaks its lines at null values.
func segments(pts []promql.FPoint, step time.Duration) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for i, pt := range pts {
		if i > 0 && time.Duration(pt.T-pts[i-1].T)*time.Millisecond > step*3/2 {
			out = append(out, cur)
			cur = nil
		}
		cur = append(cur, plotter.XY{X: float64(pt.T) / 1000, Y: pt.F})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func maxY(xys plotter.XYs) float64 {
	m := 0.0
	for _, xy := range xys {
		m = math.Max(m, xy.Y)
	}
	return m
}

type legendEntry struct {
	text  string
	style draw.LineStyle
}

// drawLegend writes the entries under the chart in up to three columns
// of legendRows; what does not fit is counted in the last line.
func drawLegend(c draw.Canvas, entries []legendEntry) {
	if len(entries) == 0 {
		return
	}
	cols := 1
	for cols < 3 && len(entries) > cols*legendRows {
		cols++
	}
	fit := cols * legendRows
	if len(entries) > fit {
		more := len(entries) - fit + 1
		entries = append(entries[:fit-1:fit-1], legendEntry{text: fmt.Sprintf("+%d more", more), style: draw.LineStyle{Color: color.Transparent}})
	}
	sty := textStyle(9.5, inkColor)
	colW := (c.Max.X - c.Min.X) / vg.Length(cols)
	maxText := int(float64(legendMaxText) * 2 / float64(cols))
	rowH := (c.Max.Y - c.Min.Y) / legendRows
	for i, e := range entries {
		col, row := i/legendRows, i%legendRows
		x := c.Min.X + vg.Length(col)*colW
		y := c.Max.Y - vg.Length(row+1)*rowH + 3
		c.StrokeLine2(draw.LineStyle{Color: e.style.Color, Width: vg.Points(3)}, x, y+3, x+14, y+3)
		txt := e.text
		if len(txt) > maxText {
			txt = txt[:maxText-3] + "..."
		}
		c.FillText(sty, vg.Point{X: x + 19, Y: y}, txt)
	}
}

// trimLegend drops the enum prefixes planex's label values carry.
func trimLegend(s string) string {
	for _, p := range []string{"RUN_STATUS_", "STOP_REASON_", "ERROR_CODE_", "REPLAN_CAUSE_"} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}

// wrap breaks s into lines of at most n bytes at spaces.
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > n {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}

// unitTicks labels the default ticks in a Grafana unit.
func unitTicks(unit string) plot.Ticker {
	return plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		ts := plot.DefaultTicks{}.Ticks(lo, hi)
		for i := range ts {
			if ts[i].Label != "" {
				ts[i].Label = FormatUnit(unit, ts[i].Value)
			}
		}
		return ts
	})
}

// FormatUnit writes v as Grafana writes it in the unit (percentunit, s,
// ops, bytes; anything else as short, with SI suffixes).
func FormatUnit(unit string, v float64) string {
	switch unit {
	case "percentunit":
		return num(v*100) + "%"
	case "s":
		switch a := math.Abs(v); {
		case a == 0:
			return "0"
		case a < 1:
			return num(v*1000) + " ms"
		default:
			return num(v) + " s"
		}
	case "ops":
		return si(v) + "/s"
	case "bytes":
		units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
		i := 0
		for math.Abs(v) >= 1024 && i < len(units)-1 {
			v /= 1024
			i++
		}
		return num(v) + " " + units[i]
	default:
		return si(v)
	}
}

func si(v float64) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if math.Abs(v) >= u.f {
			return num(v/u.f) + u.s
		}
	}
	return num(v)
}

func num(v float64) string {
	return strconv.FormatFloat(v, 'g', 3, 64)
}
