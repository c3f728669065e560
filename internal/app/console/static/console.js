// The console works without JavaScript; this only asks once more before a
// form marked data-confirm acts (replay, purge).
document.addEventListener("submit", function (e) {
  var msg = e.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) {
    e.preventDefault();
  }
});
