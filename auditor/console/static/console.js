// gpu-auditor console: sorting and filtering of the small tables in the page, and applying the
// job list's filters on change. Every page works without it (the job list sorts and filters on
// the server, over every job).
"use strict";
(function () {
  function cellValue(row, i) {
    var text = (row.cells[i] ? row.cells[i].textContent : "").trim();
    var num = parseFloat(text.replace(/[,%]/g, ""));
    return isNaN(num) || !/^[-\d.,]+%?$/.test(text) ? text.toLowerCase() : num;
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, i) {
      th.style.cursor = "pointer";
      th.title = "sort";
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var asc = th.getAttribute("data-sorted") !== "asc";
        rows.sort(function (a, b) {
          var x = cellValue(a, i), y = cellValue(b, i);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-sorted"); });
        th.setAttribute("data-sorted", asc ? "asc" : "desc");
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var table = document.querySelector("table." + input.getAttribute("data-table"));
    if (!table) return;
    input.addEventListener("input", function () {
      var needle = input.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        r.hidden = needle !== "" && r.textContent.toLowerCase().indexOf(needle) < 0;
      });
    });
  });
  document.querySelectorAll("form.filters select").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
})();
