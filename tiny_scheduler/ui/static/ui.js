// The dashboard's one script: refresh the open page every few seconds, keep relative times
// ("3 min ago") current in between, and ask before a cancel. Every page works without it.
(function () {
  "use strict";

  var PAUSED_KEY = "tiny-scheduler.refresh-paused";
  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  var every = (Number(document.body.dataset.refreshSecs) || 5) * 1000;
  var state = document.getElementById("refresh-state");
  var toggle = document.getElementById("refresh-toggle");
  var paused = readPaused();
  var busy = false;
  var skewMs = 0; // server clock minus browser clock, so relative times match the server's

  function readPaused() {
    try {
      return window.localStorage.getItem(PAUSED_KEY) === "1";
    } catch (e) {
      return false; // storage disabled: just never remember the choice
    }
  }

  function savePaused() {
    try {
      window.localStorage.setItem(PAUSED_KEY, paused ? "1" : "0");
    } catch (e) {
      // storage disabled: the choice lasts for this page only
    }
  }

  // Same wording as tiny_scheduler/ui/formatting.py relative_time().
  function relative(ms) {
    var seconds = Math.abs(ms) / 1000;
    if (seconds < 1) {
      return "just now";
    }
    for (var i = 0; i < UNITS.length; i++) {
      if (seconds >= UNITS[i][0]) {
        var text = Math.floor(seconds / UNITS[i][0]) + " " + UNITS[i][1];
        return ms > 0 ? text + " ago" : "in " + text;
      }
    }
    return "just now";
  }

  function learnSkew(content) {
    var serverNow = Number(content.dataset.nowMs);
    if (serverNow) {
      skewMs = serverNow - Date.now();
    }
  }

  function updateTimes() {
    var now = Date.now() + skewMs;
    document.querySelectorAll("time[data-ms]").forEach(function (el) {
      el.textContent = relative(now - Number(el.dataset.ms));
    });
  }

  function show(text, stale) {
    state.textContent = text;
    state.classList.toggle("stale", Boolean(stale));
  }

  function showMode() {
    toggle.textContent = paused ? "Resume" : "Pause";
    show(paused ? "auto-refresh paused" : "auto-refresh every " + every / 1000 + " s");
  }

  // Don't pull the page from under someone reading a selection or typing in a field.
  function userIsBusy(content) {
    var selection = window.getSelection();
    if (selection && !selection.isCollapsed && content.contains(selection.anchorNode)) {
      return true;
    }
    var active = document.activeElement;
    return Boolean(active && content.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function swap(content, fresh) {
    var open = [];
    content.querySelectorAll("details[open][id]").forEach(function (el) {
      open.push(el.id);
    });
    content.innerHTML = fresh.innerHTML;
    content.dataset.nowMs = fresh.dataset.nowMs || "";
    open.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) {
        el.open = true;
      }
    });
  }

  function refresh() {
    var content = document.getElementById("content");
    if (paused || busy || document.hidden || !content || userIsBusy(content)) {
      return;
    }
    busy = true;
    fetch(window.location.href, { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.getElementById("content");
        if (!fresh) {
          throw new Error("no content in the page");
        }
        swap(content, fresh);
        learnSkew(content);
        updateTimes();
        showMode();
      })
      .catch(function () {
        show("refresh failed, retrying", true);
      })
      .then(function () {
        busy = false;
      });
  }

  document.addEventListener("submit", function (event) {
    var question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  toggle.hidden = false;
  toggle.addEventListener("click", function () {
    paused = !paused;
    savePaused();
    showMode();
    if (!paused) {
      refresh();
    }
  });

  var content = document.getElementById("content");
  if (content) {
    learnSkew(content);
  }
  showMode();
  updateTimes();
  window.setInterval(updateTimes, 1000);
  window.setInterval(refresh, every);
})();
