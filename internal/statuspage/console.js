"use strict";
// What both consoles share. The page's own script defines render(d) and
// calls startConsole(render): every REFRESH_MS it reads api/console and
// redraws. Every value is written as text (textContent), never as
// markup: group names and statement texts come from clients.
const REFRESH_MS = 2000;
const nf = (digits) => new Intl.NumberFormat("en-US", {maximumFractionDigits: digits, minimumFractionDigits: 0});
const fmt0 = nf(0), fmt1 = nf(1), fmt2 = nf(2);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function num(text) { return el("td", text, "num"); }
function rate(x) { return x >= 100 ? fmt0.format(x) : x >= 1 ? fmt1.format(x) : fmt2.format(x); }

function fact(list, label, value, cls) {
  const li = el("li");
  li.append(label + ": ");
  li.append(el("span", value, cls));
  list.append(li);
}

// stamp shows when the figures were taken (d.time of the answer).
function stamp(time) {
  document.getElementById("updated").textContent = "updated " + new Date(time).toLocaleTimeString() + ", every " + REFRESH_MS / 1000 + " s";
}

// meter appends to cell a bar of used against the limit (over the limit
// in red), with its percentage for screen readers and on hover.
function meter(cell, used, limit) {
  const share = used / limit;
  const m = el("span", null, share > 1 ? "meter over" : "meter");
  m.setAttribute("role", "img");
  m.setAttribute("aria-label", fmt0.format(share * 100) + "% of the limit");
  m.title = fmt0.format(share * 100) + "% of RU_PER_SEC";
  const bar = el("span");
  bar.style.width = Math.min(share, 1) * 100 + "%";
  m.append(bar);
  cell.append(m);
}

function startConsole(render) {
  async function tick() {
    const box = document.getElementById("error");
    try {
      const r = await fetch("api/console", {cache: "no-store"});
      if (!r.ok) throw new Error("HTTP " + r.status);
      render(await r.json());
      box.style.display = "none";
    } catch (e) {
      box.textContent = "Cannot read api/console (" + e.message + "); the figures below are from the last answer. Retrying.";
      box.style.display = "block";
    } finally {
      setTimeout(tick, REFRESH_MS);
    }
  }
  tick();
}
