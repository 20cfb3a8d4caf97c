#!/bin/sh
# PNG plots of the scaling study from the data files bench/scaling/analyze.py
# writes (curves.dat, split.dat, predict.dat) in RESULTS.  Uses gnuplot;
# installs gnuplot-nox with apt-get when it is absent and we are root (the
# only place in the project that installs anything for a plot; never tests).
#
#   bench/scaling/plot.sh RESULTS
set -u
r=${1:?usage: plot.sh RESULTS}
if ! command -v gnuplot >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "plot.sh: installing gnuplot-nox (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null 2>&1; }
    fi
    command -v gnuplot >/dev/null 2>&1 || { echo "plot.sh: no gnuplot (apt-get install gnuplot-nox)" >&2; exit 1; }
fi
cd "$r" || exit 1
n=$(grep -c '^"' curves.dat 2>/dev/null || echo 0)
gnuplot <<EOF || exit 1
set terminal pngcairo size 900,560 font "sans,10"
set grid
set key outside right
set output "efficiency.png"
set title "Scaling efficiency (compute / step time), emulated 25 GbE cluster"
set xlabel "workers"; set ylabel "efficiency"; set logscale x 2; set yrange [0:1.05]
plot for [i=0:$n-1] "curves.dat" index i using 1:2 with linespoints title columnheader(1)
set output "throughput.png"
set title "Throughput in single-worker units (ideal = workers)"
set ylabel "speed-up"; set yrange [*:*]; unset logscale y
plot for [i=0:$n-1] "curves.dat" index i using 1:3 with linespoints title columnheader(1), x with lines dt 2 title "ideal"
set output "split.png"
set title "Step split at 8 workers (real-cluster ms): data wait / compute / communication wait"
set style data histograms; set style histogram rowstacked; set style fill solid 0.8 border -1
set boxwidth 0.7; unset logscale x; set xtics rotate by -35; set xlabel ""; set ylabel "ms"; set yrange [0:*]
plot "split.dat" using 2:xtic(1) title "data wait", "" using 3 title "compute", "" using 4 title "comm wait"
set output "predict.png"
set style data linespoints; set xtics norotate; set logscale x 2; set yrange [0:1.05]
set title "Alpha-beta model: predicted efficiency on a 25 GbE cluster (fp16, overlap)"
set xlabel "workers (GPUs)"; set ylabel "efficiency"

set label "paper: about 80% at 1,536 GPUs" at 20,0.55 noenhanced
# predict.dat: W, then per model (TSM-R50, I3D-R50 3x1x1, I3D-R50 3x3x3)
# efficiency and ms of ring, PS S = W co-located fit, PS S = W
# dedicated-server fit, PS S = 4
plot "predict.dat" using 1:2 title "TSM-R50 ring", "" using 1:4 title "TSM-R50 PS, S = W (co-located fit)", \
     "" using 1:6 title "TSM-R50 PS, S = W (dedicated fit)" dt 2, "" using 1:8 title "TSM-R50 PS, S = 4", \
     "" using 1:10 title "I3D-R50 3x1x1 ring", "" using 1:12 title "I3D-R50 3x1x1 PS, S = W (co-located fit)", \
     "" using 1:18 title "I3D-R50 3x3x3 ring", "" using 1:20 title "I3D-R50 3x3x3 PS, S = W (co-located fit)", \
     "<echo 1536 0.8" using 1:2 with points pt 7 ps 2 title "paper (TSM, 1,536 GPUs)"
EOF
ls -1 "$(pwd)"/*.png
