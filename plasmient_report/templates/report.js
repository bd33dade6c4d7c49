// Click (or Enter on) a header to sort its table; cells sort by data-sort when present, numbers numerically.
(function () {
  function key(cell) {
    var s = cell ? (cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim()) : "";
    var n = s === "" ? NaN : Number(s.replace(/,/g, ""));
    return { s: s, n: n };
  }
  function compare(a, b) {
    var an = !isNaN(a.n), bn = !isNaN(b.n);
    if (an && bn) return a.n - b.n;
    if (an !== bn) return an ? 1 : -1;  // blanks first when ascending
    return a.s.localeCompare(b.s, undefined, { numeric: true });
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
    var asc = th.dataset.dir !== "asc";
    table.querySelectorAll("thead th").forEach(function (h) { delete h.dataset.dir; });
    th.dataset.dir = asc ? "asc" : "desc";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var c = compare(key(r1.cells[col]), key(r2.cells[col]));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.tabIndex = 0;
    th.title = "sort by this column";
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortBy(th); } });
  });
})();
