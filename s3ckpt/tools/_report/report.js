(function () {
  "use strict";
  function run(el) { return el.closest("section.run"); }
  function pointOf(sec, i) { return document.getElementById(sec.id + "-p" + i); }
  function rowOf(sec, i) { return document.getElementById(sec.id + "-c" + i); }
  var lit = [];
  function unlight() { lit.forEach(function (e) { e.classList.remove("hl"); }); lit = []; }
  function light(sec, i) {
    unlight();
    if (!sec) { return; }
    var p = pointOf(sec, i), r = rowOf(sec, i);
    if (p) { p.classList.add("hl"); lit.push(p); }
    if (r) { r.classList.add("hl"); lit.push(r); }
    var d = sec.querySelector(".detail"), t = p && p.querySelector("title");
    if (d && t) { d.textContent = t.textContent; }
  }
  function anchor(x) { return x > %(hi)s ? "end" : (x < %(lo)s ? "start" : "middle"); }
  function setAxis(sec, mode) {
    if (sec.getAttribute("data-x") === mode) { return; }
    sec.setAttribute("data-x", mode);
    var key = mode === "time" ? "data-xt" : "data-xs";
    var els = sec.querySelectorAll("[data-xs]");
    for (var k = 0; k < els.length; k++) {
      var el = els[k], v = el.getAttribute(key);
      if (!v) { el.style.display = "none"; continue; }
      el.style.display = "";
      if (el.tagName.toLowerCase() === "text") {
        el.setAttribute("x", v);
        el.setAttribute("text-anchor", anchor(+v));
      } else {
        el.setAttribute("cx", v);
      }
    }
    var cs = sec.querySelectorAll("polyline[data-ps]");
    for (k = 0; k < cs.length; k++) {
      cs[k].setAttribute("points", cs[k].getAttribute(mode === "time" ? "data-pt" : "data-ps"));
    }
    var bs = sec.querySelectorAll("button[data-xmode]");
    for (k = 0; k < bs.length; k++) {
      bs[k].setAttribute("aria-pressed", String(bs[k].getAttribute("data-xmode") === mode));
    }
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var key = th.getAttribute("data-sort"), num = th.getAttribute("data-type") === "num";
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    var ths = table.querySelectorAll("th[data-sort]");
    for (var k = 0; k < ths.length; k++) { ths[k].setAttribute("aria-sort", "none"); }
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    var keyed = rows.map(function (r) {
      var v = r.dataset[key];
      if (num) { v = (v === undefined || v === "") ? NaN : parseFloat(v); }
      else { v = v === undefined ? "" : v; }
      return [v, +r.dataset.i, r];
    });
    keyed.sort(function (a, b) {
      var x = a[0], y = b[0];
      if (num) {
        var xn = x !== x, yn = y !== y;  // missing values last, either way
        if (xn || yn) { return xn && yn ? a[1] - b[1] : (xn ? 1 : -1); }
        return x === y ? a[1] - b[1] : (x < y ? -dir : dir);
      }
      return x === y ? a[1] - b[1] : (x < y ? -dir : dir);
    });
    var frag = document.createDocumentFragment();
    keyed.forEach(function (k) { frag.appendChild(k[2]); });
    body.appendChild(frag);
  }
  document.addEventListener("click", function (e) {
    var t = e.target;
    var b = t.closest && t.closest("button[data-xmode]");
    if (b) { setAxis(run(b), b.getAttribute("data-xmode")); return; }
    var th = t.closest && t.closest("th[data-sort]");
    if (th) { sortBy(th); return; }
    var p = t.closest && t.closest(".pt");
    if (p) {
      var sec = run(p), r = rowOf(sec, p.getAttribute("data-i"));
      light(sec, p.getAttribute("data-i"));
      if (r) { r.scrollIntoView({block: "nearest"}); }
    }
  });
  document.addEventListener("mouseover", function (e) {
    var t = e.target, el = t.closest && (t.closest(".pt") || t.closest("tr.checkpoint"));
    if (el) { light(run(el), el.getAttribute("data-i")); }
  });
  document.addEventListener("change", function (e) {
    var f = e.target.getAttribute && e.target.getAttribute("data-filter");
    if (f) { document.body.setAttribute("data-f" + f, e.target.value); }
  });
})();
