/* Dashboard behaviour: copy buttons and the occupancy charts (vendored Chart.js, loaded before this file).
 *
 * A <canvas data-occupancy-url="..."> is filled from the occupancy JSON endpoint: one stacked area per release
 * (its cache scope: tenant_id, served_model_name, namespace, request_group null = every group; bytes), x = bucket start in UTC,
 * plus a dashed horizontal line per payload.quota_lines entry (tenant quota, effective quota, release budget; each
 * its own stack, so it adds to nothing); the y axis ticks at round binary units (0, 2 MiB, 4 MiB, ...). A canvas
 * with the id "<canvas id>-hits", when present, gets the hit ratio per bucket (0..1) of each release from the same
 * payload; a canvas with the id "<canvas id>-evictions" the blocks evicted per bucket by cause (payload.evictions:
 * store = the master evicted them, budget = the agent removed them over a budget, orphan = the agent removed them
 * below a block gone), stacked bars. The Chart instance is kept in window.kvpoolCharts[canvas.id]
 * (also reachable with Chart.getChart(canvas)); canvas.dataset.state becomes "ready" or "error".
 * A <button data-copy="ID"> copies the text of the element with that id.
 * An <input data-names-url="..." list="ID"> gets a type-ahead: as it is typed in (or focused), its <datalist> is
 * filled with the names the endpoint (GET /api/v1/names/<kind>/?q=&limit=) returns for the text so far, narrowed
 * by the values of the form's inputs named in data-narrow; input.dataset.namesState becomes "ready" with the
 * number of names in data-names-count (or "error").
 */
(function () {
  "use strict";
  var PALETTE = ["#2b62c9", "#e07b39", "#3a9e5c", "#b3261e", "#8a5cc2", "#1f9aa8", "#c2a12b", "#7a7f87",
                 "#d35f9b", "#4c7a2e"];
  // Binary units with IEC suffixes, as tenants.quota.humanize_bytes writes them.
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  window.kvpoolCharts = window.kvpoolCharts || {};

  // Bytes as "256 MiB" / "1.5 KiB" / "1023 B": about 3 significant digits, trailing zeros dropped (the rule of
  // tenants.quota.humanize_bytes, so the chart and the tables read the same).
  function humanBytes(value) {
    if (value === null || value === undefined) { return "–"; }
    var size = Math.abs(value), unit = 0;
    while (size >= 1024 && unit < UNITS.length - 1) { size /= 1024; unit += 1; }
    var sign = value < 0 ? "-" : "";
    if (unit === 0) { return sign + size + " B"; }
    var text = size.toFixed(size < 10 ? 2 : size < 100 ? 1 : 0);
    if (text.indexOf(".") >= 0) { text = text.replace(/0+$/, "").replace(/\.$/, ""); }
    return sign + text + " " + UNITS[unit];
  }

  function bucketLabel(iso, bucketSeconds) {
    // iso like 2026-11-30T12:05:00+00:00 (UTC); show the date only for windows of days.
    var day = iso.slice(5, 10), time = iso.slice(11, 16);
    return bucketSeconds >= 3600 ? day + " " + time : time;
  }

  function withAlpha(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // Colours of the quota and budget lines (payload.quota_lines[].kind).
  var LINE_COLOURS = {quota: "#202124", effective_quota: "#b3261e", budget: "#e07b39",
                      request_group_budget: "#8a5cc2"};

  // The largest power of two (bytes) that splits 0..top into at most `most` steps: ticks fall on 1/2/4/8...
  // KiB/MiB/GiB multiples.
  function binaryStep(top, most) {
    var step = 1;
    while (top / step > most) { step *= 2; }
    return step;
  }

  // y-axis range and ticks at round binary units: 0 .. a multiple of binaryStep covering the stacked data, the
  // lowest quota/budget line and every line up to 4 times that (a line far above, such as a 64 GiB quota over
  // 20 MiB of data, stays in the legend with its size instead of flattening the data).
  function binaryAxis(payload) {
    var top = 0;
    (payload.totals || []).forEach(function (v) { if (v !== null && v > top) { top = v; } });
    var lines = (payload.quota_lines || []).map(function (l) { return l.bytes; });
    if (lines.length) {
      var base = Math.max(top, Math.min.apply(null, lines));
      top = Math.max.apply(null, [base].concat(lines.filter(function (b) { return b <= 4 * base; })));
    }
    if (top <= 0) { top = 1024; }
    var step = binaryStep(top * 1.05, 8), max = Math.ceil(top * 1.05 / step) * step;
    return {
      stacked: true, min: 0, max: max,
      afterBuildTicks: function (scale) {
        var ticks = [];
        for (var v = 0; v <= max; v += step) { ticks.push({value: v}); }
        scale.ticks = ticks;
      },
      ticks: {callback: function (v) { return humanBytes(v); }},
      title: {display: true, text: "bytes (binary units)"}
    };
  }

  function lineDatasets(payload) {
    return (payload.quota_lines || []).map(function (line, index) {
      var colour = LINE_COLOURS[line.kind] || "#7a7f87";
      return {
        label: line.label, data: payload.labels.map(function () { return line.bytes; }), stack: "line-" + index,
        borderColor: colour, backgroundColor: colour, borderDash: line.kind === "budget" && line.implicit ? [2, 3] : [6, 4],
        borderWidth: 1.5, pointRadius: 0, pointHoverRadius: 0, pointStyle: "line", fill: false,
        kvpool: {kind: line.kind, bytes: line.bytes, implicit: line.implicit}
      };
    });
  }

  function percent(v) { return v === null || v === undefined ? "–" : Math.round(v * 100) + "%"; }

  // The hit ratio chart beside the bytes: one line per release (same colours), and "all shown" when several.
  function drawHitRatio(canvas, payload, labels) {
    var datasets = payload.series.map(function (series, index) {
      var colour = PALETTE[index % PALETTE.length];
      return {label: series.label, data: series.hit_ratio_data, borderColor: colour, backgroundColor: colour,
              pointRadius: 2, borderWidth: 1.5, spanGaps: true, fill: false};
    });
    if (payload.series.length > 1) {
      datasets.push({label: "all shown", data: payload.hit_ratios, borderColor: "#202124", backgroundColor: "#202124",
                     borderDash: [6, 4], pointRadius: 0, borderWidth: 2, spanGaps: true, fill: false});
    }
    var existing = window.Chart.getChart(canvas);
    if (existing) { existing.destroy(); }
    var chart = new window.Chart(canvas, {
      type: "line", data: {labels: labels, datasets: datasets},
      options: {
        responsive: true, maintainAspectRatio: false, animation: false, interaction: {mode: "index", intersect: false},
        scales: {
          x: {ticks: {maxTicksLimit: 12, autoSkip: true}},
          y: {min: 0, max: 1, ticks: {stepSize: 0.25, callback: percent}, title: {display: true, text: "hit ratio"}}
        },
        plugins: {
          legend: {display: false},
          tooltip: {callbacks: {label: function (ctx) { return ctx.dataset.label + ": " + percent(ctx.parsed.y); }}}
        }
      }
    });
    window.kvpoolCharts[canvas.id] = chart;
    canvas.dataset.state = "ready";
    return chart;
  }

  // Causes of evictions (payload.evictions keys) in stacking order, with their colours and legend labels.
  var CAUSES = [{key: "store", label: "evicted by the Store's master", colour: "#b3261e"},
                {key: "budget", label: "removed over a budget", colour: "#e07b39"},
                {key: "orphan", label: "removed as orphans", colour: "#8a5cc2"}];

  // Blocks evicted per bucket by cause over every release shown: stacked bars.
  function drawEvictions(canvas, payload, labels) {
    var evictions = payload.evictions || {};
    var datasets = CAUSES.map(function (cause) {
      return {label: cause.label, data: evictions[cause.key] || labels.map(function () { return 0; }),
              backgroundColor: cause.colour, borderColor: cause.colour, stack: "evictions",
              kvpool: {cause: cause.key}};
    });
    var existing = window.Chart.getChart(canvas);
    if (existing) { existing.destroy(); }
    var chart = new window.Chart(canvas, {
      type: "bar", data: {labels: labels, datasets: datasets},
      options: {
        responsive: true, maintainAspectRatio: false, animation: false, interaction: {mode: "index", intersect: false},
        scales: {
          x: {stacked: true, ticks: {maxTicksLimit: 12, autoSkip: true}},
          y: {stacked: true, min: 0, beginAtZero: true, ticks: {precision: 0}, title: {display: true, text: "blocks evicted"}}
        },
        plugins: {legend: {position: "bottom"}}
      }
    });
    window.kvpoolCharts[canvas.id] = chart;
    canvas.dataset.state = "ready";
    return chart;
  }

  function drawOccupancy(canvas, payload) {
    var datasets = payload.series.map(function (series, index) {
      var colour = PALETTE[index % PALETTE.length];
      var points = series.data.filter(function (v) { return v !== null; }).length;
      return {
        label: series.label, data: series.data, borderColor: colour, backgroundColor: withAlpha(colour, 0.35),
        fill: index === 0 ? "origin" : "-1", pointRadius: points <= 2 ? 3 : 0, pointHoverRadius: 4, borderWidth: 1.5, tension: 0.2, spanGaps: true,
        stack: "bytes", pointStyle: "rect",
        kvpool: {tenant_id: series.tenant_id, served_model_name: series.served_model_name,
                 namespace: series.namespace, request_group: series.request_group}
      };
    });
    var labels = payload.labels.map(function (l) { return bucketLabel(l, payload.bucket_seconds); });
    var existing = window.Chart.getChart(canvas);
    if (existing) { existing.destroy(); }
    var chart = new window.Chart(canvas, {
      type: "line",
      data: {labels: labels, datasets: datasets.concat(lineDatasets(payload))},
      options: {
        responsive: true, maintainAspectRatio: false, animation: false, interaction: {mode: "index", intersect: false},
        scales: {
          x: {ticks: {maxTicksLimit: 12, autoSkip: true}, title: {display: true, text: "time (UTC)"}},
          y: binaryAxis(payload)
        },
        plugins: {
          legend: {position: "bottom", labels: {usePointStyle: true}},
          tooltip: {callbacks: {label: function (ctx) { return ctx.dataset.label + ": " + humanBytes(ctx.parsed.y); }}}
        }
      }
    });
    window.kvpoolCharts[canvas.id] = chart;
    var empty = document.getElementById(canvas.id + "-empty");
    if (empty) { empty.hidden = payload.series.length > 0; }
    var hits = document.getElementById(canvas.id + "-hits");
    if (hits) { drawHitRatio(hits, payload, labels); }
    var evictions = document.getElementById(canvas.id + "-evictions");
    if (evictions) { drawEvictions(evictions, payload, labels); }
    canvas.dataset.state = "ready";
    return chart;
  }

  function loadOccupancy(canvas) {
    canvas.dataset.state = "loading";
    return fetch(canvas.dataset.occupancyUrl, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (payload) { return drawOccupancy(canvas, payload); })
      .catch(function (error) {
        canvas.dataset.state = "error";
        var box = document.getElementById(canvas.id + "-error");
        if (box) { box.hidden = false; box.textContent = "Could not load occupancy data: " + error.message; }
      });
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () { return legacyCopy(text); });
    }
    return Promise.resolve(legacyCopy(text));
  }

  function legacyCopy(text) {
    var area = document.createElement("textarea");
    area.value = text; area.setAttribute("readonly", ""); area.style.position = "fixed"; area.style.top = "-1000px";
    document.body.appendChild(area); area.select();
    try { document.execCommand("copy"); } finally { document.body.removeChild(area); }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (!button) { return; }
    var source = document.getElementById(button.dataset.copy);
    if (!source) { return; }
    copyText(source.textContent).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      button.dataset.copied = "true";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  var NAMES_LIMIT = 20;

  // Fill input's <datalist> with the names starting with its text; a newer keystroke's answer wins.
  function loadNames(input) {
    var params = new URLSearchParams({q: input.value, limit: String(NAMES_LIMIT)});
    (input.dataset.narrow || "").split(" ").filter(Boolean).forEach(function (name) {
      var other = input.form && input.form.elements[name];
      if (other && other.value) { params.set(name, other.value); }
    });
    var serial = (input._namesSerial || 0) + 1;
    input._namesSerial = serial;
    input.dataset.namesState = "loading";
    return fetch(input.dataset.namesUrl + "?" + params.toString(),
                 {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (payload) {
        if (serial !== input._namesSerial) { return; }
        var list = document.getElementById(input.getAttribute("list"));
        list.replaceChildren.apply(list, payload.results.map(function (name) {
          var option = document.createElement("option");
          option.value = name;
          return option;
        }));
        input.dataset.namesCount = String(payload.results.length);
        input.dataset.namesState = "ready";
      })
      .catch(function () { input.dataset.namesState = "error"; });
  }

  function typeAhead(input) {
    var timer = null;
    function later() {
      clearTimeout(timer);
      timer = setTimeout(function () { loadNames(input); }, 150);
    }
    input.addEventListener("input", later);
    input.addEventListener("focus", function () { loadNames(input); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("input[data-names-url]").forEach(typeAhead);
    document.querySelectorAll("canvas[data-occupancy-url]").forEach(function (canvas) {
      loadOccupancy(canvas);
      var every = parseInt(canvas.dataset.refreshSeconds || "0", 10);
      if (every > 0) { setInterval(function () { loadOccupancy(canvas); }, every * 1000); }
    });
  });

  window.kvpool = {humanBytes: humanBytes, binaryStep: binaryStep, loadOccupancy: loadOccupancy, loadNames: loadNames};
})();
